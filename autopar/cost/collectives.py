"""Collective time from measured link behaviour, and which links a process group spans (vectorised).

Conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md): an all-reduce moves 2(n-1)/n of its buffer S
per rank, reduce-scatter and all-gather (n-1)/n of the whole buffer, all-to-all (n-1)/n of a rank's
send buffer, send/recv all of it; bus bandwidth (busbw) is that volume over the time.

A group that spans nodes runs hierarchically (NCCL's NVLS-tree / hierarchical algorithms): the part
inside a node on NVLink, the cross-node part on the NIC rails of the group's members in a node,
each rail one NIC. The time of each part comes from published measurements (autopar.spec.behaviour):
- inside a node: the GPU's nccl-tests all-reduce time by message size (latency included), capped
  for the ring algorithms (all-gather, reduce-scatter) at their measured large-message busbw, and
  scaled to the group size by the measured busbw per GPU count (NVLink SHARP needs 5+ GPUs);
- across nodes: each NIC at the fraction of its line rate NCCL reaches (48 of 50 GB/s on CX-7), times
  the measured size efficiency of a multi-node all-reduce (GTC24 NVLS-tree scan at 32 and 8192 GPUs,
  interpolated in log GPUs), plus NCCL's per-hop latency on a tree;
- NCCL all-to-all: the in-node share at its measured NVLink busbw, the cross-node share at one NIC
  (all-to-all cannot aggregate NICs), concurrently;
- DeepEP / HybridEP dispatch and combine: deduplicated per node over RDMA, forwarded over NVLink.
A GPU without published NVLink figures (a custom GPU, the local CPU profile) is priced alpha-beta
from its line rates: `intra_node_bw_efficiency` x line rate and the cluster's per-step latencies.

Placement: ranks are laid out in MESH_ORDER with tp innermost (autopar.spec.plan), so a group is
`size` ranks at a fixed `stride`; `gpus_per_node` consecutive ranks share a node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.spec.behaviour import measured_behaviour, shared_figures
from autopar.spec.curves import NetworkFigures, NvlinkFigures
from autopar.spec.hardware import ClusterSpec

ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, SEND = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "send",
)
#: bus-volume factor of each kind over its group: x (n-1)/n, all-reduce twice
_HALF_RINGS = {ALL_REDUCE: 2.0, REDUCE_SCATTER: 1.0, ALL_GATHER: 1.0}
#: GPUs per node of the published multi-node scans
_SCAN_GPUS_PER_NODE = 8


@dataclass
class Links:
    """A cluster's links as the cost model prices them."""

    gpus_per_node: int
    nvlink: NvlinkFigures | None  # measured; None: alpha-beta from the line rates
    nvlink_scale: float  # the cluster's NVLink rate over its preset's (a cluster file may change it)
    intra_line: float  # B/s per GPU per direction
    inter_line: float  # B/s per NIC (one per GPU) per direction
    intra_full_mesh: bool
    intra_lat: float  # s per step (alpha-beta only)
    inter_lat: float
    network: NetworkFigures
    intra_eff: float  # `intra_node_bw_efficiency`: alpha-beta only (the measured curves are what NCCL reaches)
    inter_eff: float
    dispatch_nvlink_fraction: float  # DeepEP's NVLink rate / line rate on this GPU generation

    @classmethod
    def of(cls, cluster: ClusterSpec) -> "Links":
        k = cluster.constants
        beh = measured_behaviour(cluster.gpu, cluster.measured)  # what `autopar probe` measured, else published
        shared = shared_figures()
        return cls(
            gpus_per_node=cluster.gpus_per_node,
            nvlink=beh.nvlink,
            nvlink_scale=cluster.intra_node_gbps / cluster.gpu.intra_node_gbps,
            intra_line=cluster.intra_node_gbps * 1e9,
            inter_line=cluster.inter_node_gbps * 1e9,
            intra_full_mesh=cluster.intra_node_topology == "full-mesh",
            intra_lat=cluster.intra_node_latency_us * 1e-6,
            inter_lat=cluster.inter_node_latency_us * 1e-6,
            network=shared.network,
            intra_eff=k.intra_node_bw_efficiency,
            inter_eff=k.inter_node_bw_efficiency,
            dispatch_nvlink_fraction=beh.dispatch_nvlink_fraction or shared.dispatch.nvlink_fraction,
        )


@dataclass
class Group:
    """A process group: `size` ranks at `stride`, `per_node` of them in each of `nodes` nodes."""

    size: np.ndarray
    per_node: np.ndarray
    nodes: np.ndarray


def place(size, stride, gpus_per_node: int) -> Group:
    """Ranks per node of a group of `size` ranks spaced `stride` apart (ranks fill nodes in order).
    Source: the rank-order rule of Megatron-Core parallel_state (tp innermost)."""
    size = np.asarray(size, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    per_node = np.clip(gpus_per_node // np.maximum(stride, 1), 1, None)
    per_node = np.minimum(per_node, size)
    nodes = -(-size // per_node)
    return Group(size=size, per_node=per_node, nodes=nodes)


# ---- inside a node ---------------------------------------------------------------------------------


def _nvlink_busbw(links: Links, kind: str, nbytes, g) -> np.ndarray:
    """Measured busbw (B/s) of one call of `kind` on `g` GPUs of one node with an `nbytes` buffer."""
    nv = links.nvlink
    assert nv is not None  # the callers take the line-rate path without measured NVLink figures
    s = np.maximum(np.asarray(nbytes, dtype=float), 1.0)
    ar8 = 1.75 * s / nv.all_reduce_s(s)  # the measured 8-GPU all-reduce at this size
    peak8 = float(1.75 * nv.all_reduce_s.x[-1] / nv.all_reduce_s.y[-1])
    g = np.asarray(g, dtype=float)
    scale = links.nvlink_scale
    if kind == ALL_REDUCE:
        by = nv.by_gpus(np.clip(g, 4, 8)) if nv.by_gpus is not None else np.full(g.shape, nv.sharp_busbw)
        peak_g = np.where(g >= 8, nv.sharp_busbw, np.where(g >= 4, by, nv.ring_busbw))
        return ar8 * np.minimum(1.0, peak_g / peak8) * scale
    size_eff = ar8 / peak8
    if kind == ALL_TO_ALL:
        return nv.all_to_all_busbw * np.minimum(1.0, size_eff * peak8 / nv.ring_busbw) * scale
    if kind == SEND:
        return nv.p2p * np.minimum(1.0, size_eff * peak8 / nv.ring_busbw) * scale
    return np.minimum(ar8, nv.ring_busbw) * scale


def _intra_line_bw(links: Links, per_node) -> np.ndarray:
    """Alpha-beta link rate: NVSwitch gives every GPU its full rate; a full mesh (MI300X) gives a
    group of g ranks g-1 links."""
    bw = links.intra_line * links.intra_eff
    if links.intra_full_mesh:
        return bw * np.maximum(np.asarray(per_node) - 1, 1)
    return np.full(np.shape(per_node), bw)


# ---- across nodes ----------------------------------------------------------------------------------


def _scan_efficiency(net: NetworkFigures, per_nic_bytes, gpus) -> np.ndarray:
    """Multi-node all-reduce busbw at this size over its large-message value, interpolated in log
    GPUs between the two published scans; the size is what the scans' 8-GPU nodes put on one NIC."""
    s = np.asarray(per_nic_bytes, dtype=float) * _SCAN_GPUS_PER_NODE
    (n_small, small), (n_large, large) = net.scan_small, net.scan_large
    log_s = np.log(np.maximum(s, 1e-30))
    log_small = small.log_at(log_s) - np.log(small.y[-1])  # the efficiencies, in logs
    log_large = large.log_at(log_s) - np.log(large.y[-1])
    w = np.clip(np.log(np.maximum(np.asarray(gpus, dtype=float), 1.0) / n_small) / np.log(n_large / n_small), 0, 1)
    return np.exp((1 - w) * log_small + w * log_large)


def _nic_rate(links: Links, per_nic_bytes, gpus) -> np.ndarray:
    """B/s one NIC sustains in a collective of this size over this many GPUs."""
    if links.nvlink is None:
        return np.full(np.shape(per_nic_bytes), links.inter_line * links.inter_eff)
    eff = _scan_efficiency(links.network, per_nic_bytes, gpus)
    return links.inter_line * links.network.nic_fraction * eff


def _inter_latency(links: Links, nodes) -> np.ndarray:
    """NCCL's latency of a cross-node phase: base + a hop per tree level (tuning.cc)."""
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    if links.nvlink is None:
        return (n - 1) * links.inter_lat
    net = links.network
    return np.where(n > 1, net.base_latency_s + np.log2(n) * net.hop_latency_s, 0.0)


def _ring_latency(links: Links, ranks, nodes) -> np.ndarray:
    """NCCL's latency of a reduce-scatter or all-gather across nodes: they run as a ring (NCCL has no
    tree for them), whose latency grows with its steps, not their logarithm: base + (ranks - nodes)
    NVLink hops + (nodes - 1) network hops (src/graph/tuning.cc: ranks - 1 steps, nodes - 1 of them
    between nodes; Simple protocol, which the large messages of a training step use). Within one node
    the measured NVLink curves hold the latency already. Links with measured NVLink figures only."""
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    net = links.network
    steps = (np.asarray(ranks, dtype=float) - n) * net.nvlink_hop_latency_s + (n - 1) * net.hop_latency_s
    return np.where(n > 1, net.base_latency_s + steps, 0.0)


# ---- one call ----------------------------------------------------------------------------------------


def collective_seconds(kind: str, nbytes, group: Group, links: Links) -> np.ndarray:
    """Seconds of one call of `kind` with buffer `nbytes` (a rank's send buffer for all-to-all, the
    gathered size for all-gather) on `group`; 0 for a group of one."""
    s = np.asarray(nbytes, dtype=float)
    n = group.size.astype(float)
    g = group.per_node.astype(float)
    nodes = group.nodes.astype(float)
    on = group.size > 1
    if kind == ALL_TO_ALL:
        intra_share, inter_share = (g - 1) / n, (n - g) / n
        intra = intra_share * s / _intra_rate(links, kind, s, g)
        inter = inter_share * s / _a2a_nic_rate(links, s / np.maximum(g, 1), n)
        t = np.maximum(intra, inter) + np.where(nodes > 1, _inter_latency(links, nodes), 0.0)
        if links.nvlink is None:
            t = intra + inter + (n - 1) * np.where(nodes > 1, links.inter_lat, links.intra_lat)
        return np.where(on, t, 0.0)
    factor = _HALF_RINGS[kind]
    intra = np.where(g > 1, factor * (g - 1) / g * s / _intra_rate(links, kind, s, g), 0.0)
    per_nic = s / g
    inter = np.where(nodes > 1, factor * (nodes - 1) / nodes * per_nic / _nic_rate(links, per_nic, n), 0.0)
    if links.nvlink is None:  # alpha-beta links: a latency per hop
        lat = factor * ((g - 1) * links.intra_lat + (nodes - 1) * links.inter_lat)
    elif kind in (ALL_GATHER, REDUCE_SCATTER):
        lat = _ring_latency(links, n, nodes)
    else:
        lat = factor * _inter_latency(links, nodes)
    return np.where(on, intra + inter + lat, 0.0)


def _intra_rate(links: Links, kind: str, s, g) -> np.ndarray:
    if links.nvlink is None:
        return _intra_line_bw(links, g)
    return _nvlink_busbw(links, kind, s, g)


def _a2a_nic_rate(links: Links, per_nic_bytes, gpus) -> np.ndarray:
    """NCCL all-to-all over one NIC: its measured per-NIC busbw (GTC25: 48 GB/s on DGX H100), with
    the multi-node size efficiency [assumed: no published all-to-all size curve]."""
    if links.nvlink is None:
        return np.full(np.shape(per_nic_bytes), links.inter_line * links.inter_eff)
    eff = _scan_efficiency(links.network, per_nic_bytes, gpus)
    return links.inter_line * links.network.all_to_all_fraction * eff


def p2p_seconds(nbytes, crosses_node, links: Links) -> np.ndarray:
    """Send/recv of `nbytes` between two ranks: NVLink at the measured P2P rate, or one NIC."""
    s = np.asarray(nbytes, dtype=float)
    if links.nvlink is None:
        bw = np.where(crosses_node, links.inter_line * links.inter_eff, links.intra_line * links.intra_eff)
        return s / bw + np.where(crosses_node, links.inter_lat, links.intra_lat)
    intra = s / _nvlink_busbw(links, SEND, s, 2)
    inter = s / _nic_rate(links, s, 2) + links.network.base_latency_s
    return np.where(crosses_node, inter, intra)


def remote_nodes_per_token(nodes, top_k: int, groups: int = 1, group_topk: int = 1, experts: int = 1) -> np.ndarray:
    """Expected distinct remote nodes one token's k routed copies reach when the EP group spans
    `nodes` nodes (each holding an equal run of consecutive experts) and the model routes each token
    inside `group_topk` of its `groups` groups of consecutive experts (autopar.spec.model.MoESpec;
    no limit: 1 / 1). The routing is taken as uniform over the experts it may choose, and a token's
    node as independent of its route, so each of the other N - 1 nodes is hit with one probability P:
    - no group limit: P = 1 - (1 - 1/N)^k (each copy on a node with probability 1/N);
    - q = G / N whole groups per node: P = 1 - C(G - q, M) / C(G, M), the node hit when one of its
      groups is chosen (Megatron scores a group by its top k / M experts, so a chosen group gets
      its share of the k copies: moe_utils.group_limited_topk);
    - a group spread over r = N / G nodes: P = (M / G)(1 - (1 - 1/r)^(k/M)), its k / M copies
      uniform over the group's nodes.
    DeepSeek-V3 at EP64 on 8 nodes (G 8, M 4): P = 1/2, 3.5 remote nodes, against 4.59 without the
    limit (the report's "each token is sent to at most 4 nodes", sec. 2.1.2)."""
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    k, g, m = float(top_k), int(groups), int(group_topk)
    if g <= 1 or m >= g or experts % g:
        return (n - 1.0) * (1.0 - (1.0 - 1.0 / n) ** k)
    values, where = np.unique(n, return_inverse=True)  # a few node counts among many plans
    return np.array([_limited_remote_nodes(int(v), k, g, m) for v in values])[where].reshape(n.shape)


def _limited_remote_nodes(nodes: int, k: float, g: int, m: int) -> float:
    """`remote_nodes_per_token` for one node count under a group limit."""
    if nodes <= 1:
        return 0.0
    if g % nodes == 0:  # q whole groups per node
        q = g // nodes
        return (nodes - 1) * (1.0 - math.comb(g - q, m) / math.comb(g, m))
    if nodes % g == 0:  # a group over r nodes
        r = nodes // g
        return (nodes - 1) * (m / g) * (1.0 - (1.0 - 1.0 / r) ** (k / m))
    return (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)  # groups not aligned with nodes: no limit priced


def deduplicated_seconds(
    nbytes, group: Group, links: Links, top_k: int, groups: int = 1, group_topk: int = 1, experts: int = 1
) -> np.ndarray:
    """A DeepEP / HybridEP dispatch or combine of a rank's k routed copies (`nbytes` = k x tokens x
    hidden x element bytes): each token crosses the network once per distinct remote node it goes to
    (`remote_nodes_per_token`: (N - 1)(1 - (1 - 1/N)^k) of the N nodes the group spans under uniform
    routing, fewer under group-limited routing, against k (N - 1)/N copies without deduplication),
    then fans out over NVLink there; the NVLink and RDMA transfers run at once (DeepEP README, normal
    kernels). RDMA at the NIC's line rate (DeepEP V1: 43-58 GB/s on a 50 GB/s CX-7), NVLink at
    DeepEP's measured fraction of the line rate."""
    s = np.asarray(nbytes, dtype=float)
    n = group.size.astype(float)
    g = group.per_node.astype(float)
    nodes = group.nodes.astype(float)
    k = float(top_k)
    copy = s / k  # one token's payload, per token of the rank
    remote_nodes = remote_nodes_per_token(nodes, top_k, groups, group_topk, experts)
    measured = links.nvlink is not None
    rdma = copy * remote_nodes / (links.inter_line * (1.0 if measured else links.inter_eff))
    # in-node copies sent directly, plus the remote copies forwarded to their GPU inside the far node
    nvlink_bytes = s * (g - 1) / n + s * (n - g) / n * (g - 1) / np.maximum(g, 1)
    nvlink = nvlink_bytes / (links.intra_line * links.dispatch_nvlink_fraction * (1.0 if measured else links.intra_eff))
    lat = links.network.base_latency_s * np.where(nodes > 1, 2.0, 1.0)
    return np.where(group.size > 1, np.maximum(nvlink, rdma) + lat, 0.0)


def allreduce_bytes_moved(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce: 2(n-1)/n * S
    (nccl-tests doc/PERFORMANCE.md; github.com/NVIDIA/nccl/issues/457)."""
    return 2 * (n - 1) / n * nbytes
