"""The EP all-to-all of one MoE plan under each dispatcher, with the bandwidths it is priced at and
where they come from (`autopar estimate`'s EP breakdown): NCCL's all-to-all (its in-node share at
the measured NVLink all-to-all busbw, its cross-node share at one NIC) and DeepEP / HybridEP's
deduplicating kernels (one RDMA copy per remote node, NVLink forwarding)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autopar.cost.collectives import Links, place, remote_nodes_per_token
from autopar.cost.comm_terms import comm_terms
from autopar.cost.price import prepare
from autopar.spec.behaviour import measured_behaviour, shared_figures
from autopar.spec.hardware import ClusterSpec
from autopar.spec.model import ModelSpec, MoESpec
from autopar.spec.plan import ParallelPlan
from autopar.spec.table import PlanTable

DISPATCHERS = ("alltoall", "deepep")


@dataclass(frozen=True)
class DispatchDetail:
    dispatcher: str
    seconds: float  # per step on the slowest rank, before any overlap hides it
    bytes: float  # the payload this GPU hands to the all-to-alls per step
    nvlink_gbps: float  # the rate its in-node part runs at
    network_gbps: float  # the rate its cross-node part runs at per NIC (0: the group is in one node)
    network_share: float  # share of the payload that crosses the network (after deduplication)
    sources: tuple[str, ...]

    @property
    def effective_gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "dispatcher": self.dispatcher,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "effective_gbps": self.effective_gbps,
            "nvlink_gbps": self.nvlink_gbps,
            "network_gbps": self.network_gbps,
            "network_share": self.network_share,
            "sources": list(self.sources),
        }


def ep_details(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, num_gpus: int, seq_len: int, imbalance):
    """One DispatchDetail per dispatcher for the plan's EP group (empty without EP)."""
    if model.moe is None or plan.ep <= 1:
        return []
    out = []
    links = Links.of(cluster)
    group = place(np.array(plan.ep), np.array(plan.etp or 1), cluster.gpus_per_node)
    g, n, nodes = int(group.per_node), plan.ep, int(group.nodes)
    for d in DISPATCHERS:
        p = prepare(
            PlanTable.from_plans([replace(plan, moe_dispatcher=d)]),
            model,
            cluster,
            num_gpus=num_gpus,
            seq_len=seq_len,
            trainer_capabilities=False,
            time_ranks=True,
        )
        x, prm, _ = p.timed
        comm = comm_terms(replace(x, routing_imbalance=imbalance), model, cluster, prm)
        m = float(x.microbatches[0])
        seconds = float(np.max(np.where(x.active, comm.ep.seconds, 0.0))) * m
        nbytes = float(np.max(np.where(x.active, comm.ep.bytes, 0.0))) * m
        out.append(_detail(d, seconds, nbytes, links, cluster, g, n, nodes, model.moe))
    return out


def _detail(d, seconds, nbytes, links: Links, cluster: ClusterSpec, g, n, nodes, moe: MoESpec) -> DispatchDetail:
    beh = measured_behaviour(cluster.gpu, cluster.measured)
    shared = shared_figures()
    crosses = nodes > 1
    if d == "alltoall":
        nvlink = beh.nvlink.all_to_all_busbw if beh.nvlink else links.intra_line * links.intra_eff
        network = links.inter_line * (shared.network.all_to_all_fraction if beh.nvlink else links.inter_eff)
        share = (n - g) / n
        sources: tuple[str, ...] = (
            f"in-node share {(g - 1) / n:.0%} at the NVLink all-to-all busbw: "
            + (beh.nvlink.all_to_all_source if beh.nvlink else "the link's line rate x intra_node_bw_efficiency"),
            f"cross-node share {share:.0%} at one NIC: " + shared.sources["network_all_to_all"],
        )
    else:
        frac = beh.dispatch_nvlink_fraction or shared.dispatch.nvlink_fraction
        nvlink = links.intra_line * frac
        network = links.inter_line
        top_k = moe.top_k
        limits = (moe.router_groups, moe.router_group_topk, moe.num_experts)
        distinct = float(remote_nodes_per_token(np.array([nodes]), top_k, *limits)[0]) if crosses else 0.0
        share = distinct / top_k
        limit = (
            f"routing limited to {moe.router_group_topk} of {moe.router_groups} expert groups"
            if 1 < moe.router_group_topk < moe.router_groups
            else "uniform routing"
        )
        sources = (
            f"each token crosses the network once per remote node it goes to ({distinct:.2f} of {nodes - 1} under "
            f"{limit}, against {top_k * (n - g) / n:.2f} copies without deduplication), then NVLink",
            f"RDMA at the NIC's line rate: {shared.sources['dispatch_rdma']}",
            f"NVLink at {frac:.0%} of the line rate: "
            + (beh.dispatch_source if beh.dispatch_nvlink_fraction else shared.sources["dispatch_nvlink"]),
        )
    return DispatchDetail(
        dispatcher=d,
        seconds=seconds,
        bytes=nbytes,
        nvlink_gbps=nvlink / 1e9,
        network_gbps=network / 1e9 if crosses else 0.0,
        network_share=share if crosses else 0.0,
        sources=sources,
    )
