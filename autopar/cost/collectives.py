"""Collective cost (alpha-beta) and which link a process group spans (vectorised).

Conventions: nccl-tests doc/PERFORMANCE.md: all-reduce moves 2(n-1)/n of the
buffer S per rank, reduce-scatter / all-gather (n-1)/n of the full buffer, all-to-all (n-1)/n of a
rank's send buffer, send/recv all of it. A group that spans nodes is modelled hierarchically
(NCCL's hierarchical algorithms): the in-node part on NVLink, the cross-node part on the g NIC rails of the g group
members in each node.

Placement: ranks are laid out in MESH_ORDER with tp innermost (autopar.spec.plan), so a group is
`size` ranks at a fixed `stride`; `gpus_per_node` consecutive ranks share a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.spec.hardware import ClusterSpec


@dataclass
class Links:
    """Effective link figures of a cluster, in bytes/s and seconds."""

    gpus_per_node: int
    intra_bw: float
    intra_full_mesh: bool
    inter_bw: float
    intra_lat: float
    inter_lat: float

    @classmethod
    def of(cls, cluster: ClusterSpec) -> "Links":
        k = cluster.constants
        return cls(
            gpus_per_node=cluster.gpus_per_node,
            intra_bw=cluster.intra_node_gbps * 1e9 * k.intra_node_bw_efficiency,
            intra_full_mesh=cluster.intra_node_topology == "full-mesh",
            inter_bw=cluster.inter_node_gbps * 1e9 * k.inter_node_bw_efficiency,
            intra_lat=cluster.intra_node_latency_us * 1e-6,
            inter_lat=cluster.inter_node_latency_us * 1e-6,
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


def _intra_bw(links: Links, per_node: np.ndarray) -> np.ndarray:
    """NVSwitch gives every GPU its full rate; a full mesh (MI300X) gives a group of g ranks g-1 links."""
    if links.intra_full_mesh:
        return links.intra_bw * np.maximum(per_node - 1, 1)
    return np.full(per_node.shape, links.intra_bw)


def all_reduce_time(nbytes, group: Group, links: Links) -> np.ndarray:
    """Ring all-reduce: 2(g-1)/g * S/B_nvlink + 2(N-1)/N * (S/g)/B_nic + 2(g-1)a_i + 2(N-1)a_e
    (alpha-beta cost model, hierarchical form)."""
    return 2.0 * _half_ring(nbytes, group, links)


def reduce_scatter_time(nbytes, group: Group, links: Links) -> np.ndarray:
    """Reduce-scatter of a full buffer S: (n-1)/n factor, hierarchical (alpha-beta cost model, hierarchical)."""
    return _half_ring(nbytes, group, links)


all_gather_time = reduce_scatter_time  # same factor, S = the gathered (full) buffer (nccl-tests doc/PERFORMANCE.md)


def _half_ring(nbytes, group: Group, links: Links) -> np.ndarray:
    per_byte, fixed = half_ring_linear(group, links)
    return np.asarray(nbytes, dtype=float) * per_byte + fixed


def half_ring_linear(group: Group, links: Links) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, seconds per call) of a reduce-scatter or all-gather: (g-1)/g * S/B_nvlink +
    (N-1)/N * (S/g)/B_nic, plus (g-1)a_i + (N-1)a_e (alpha-beta cost model, hierarchical); 0 for a group of one.
    Linear in S, so calls on one group are priced by their summed bytes (autopar.cost.comm)."""
    g = group.per_node.astype(float)
    nn = group.nodes.astype(float)
    per_byte = (g - 1) / g / _intra_bw(links, group.per_node) + (nn - 1) / nn / g / links.inter_bw
    fixed = (g - 1) * links.intra_lat + (nn - 1) * links.inter_lat
    on = group.size > 1
    return np.where(on, per_byte, 0.0), np.where(on, fixed, 0.0)


def all_to_all_time(nbytes, group: Group, links: Links) -> np.ndarray:
    """All-to-all of a rank's send buffer S: the (g-1)/n share to in-node peers over NVLink, the
    (n-g)/n share over the rank's own NIC, plus (n-1) latencies (alpha-beta cost model, hierarchical)."""
    per_byte, fixed = all_to_all_linear(group, links)
    return np.asarray(nbytes, dtype=float) * per_byte + fixed


def all_to_all_linear(group: Group, links: Links) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, seconds per call) of `all_to_all_time` (alpha-beta cost model, hierarchical)."""
    n = group.size.astype(float)
    g = group.per_node.astype(float)
    lat = np.where(group.nodes > 1, links.inter_lat, links.intra_lat)
    on = group.size > 1
    per_byte = (g - 1) / n / _intra_bw(links, group.per_node) + (n - g) / n / links.inter_bw
    return np.where(on, per_byte, 0.0), np.where(on, (n - 1) * lat, 0.0)


def deduplicated_all_to_all_time(nbytes, group: Group, links: Links, top_k: int) -> np.ndarray:
    """A dispatch or combine of DeepEP / HybridEP kernels: a token's k routed copies cross the
    network once per distinct destination node (then fan out over NVLink there), and the NVLink and
    RDMA transfers run at once (DeepEP README, 'normal kernels': intranode NVLink forwarding of
    internode RDMA). With uniform routing a token reaches (N - 1)(1 - (1 - 1/N)^k) remote nodes of
    the N the group spans, against k(N - 1)/N remote copies without deduplication."""
    per_byte, fixed = deduplicated_all_to_all_linear(group, links, top_k)
    return np.asarray(nbytes, dtype=float) * per_byte + fixed


def deduplicated_all_to_all_linear(group: Group, links: Links, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, seconds per call) of `deduplicated_all_to_all_time`: the slower of the
    NVLink and RDMA shares, both linear in S (DeepEP README)."""
    n = group.size.astype(float)
    g = group.per_node.astype(float)
    nodes = group.nodes.astype(float)
    remote = (n - g) / n
    distinct = np.where(nodes > 1, nodes * (1 - (1 - 1 / np.maximum(nodes, 1)) ** top_k) / top_k, 1.0)
    nvlink = ((g - 1) / n + remote) / _intra_bw(links, group.per_node)
    rdma = remote * distinct / links.inter_bw
    lat = np.where(group.nodes > 1, links.inter_lat, links.intra_lat) * (n - 1)
    on = group.size > 1
    return np.where(on, np.maximum(nvlink, rdma), 0.0), np.where(on, lat, 0.0)


def p2p_time(nbytes, crosses_node, links: Links) -> np.ndarray:
    """Send/recv: S/B + a on the link between the two ranks (alpha-beta cost model)."""
    per_byte, fixed = p2p_linear(crosses_node, links)
    return np.asarray(nbytes, dtype=float) * per_byte + fixed


def p2p_linear(crosses_node, links: Links) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per byte, seconds per call) of `p2p_time` (alpha-beta cost model)."""
    return (
        np.where(crosses_node, 1.0 / links.inter_bw, 1.0 / links.intra_bw),
        np.where(crosses_node, links.inter_lat, links.intra_lat),
    )


def allreduce_bytes_moved(nbytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce: 2(n-1)/n * S
    (nccl-tests doc/PERFORMANCE.md; github.com/NVIDIA/nccl/issues/457)."""
    return 2 * (n - 1) / n * nbytes
