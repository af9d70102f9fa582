"""Turn command-line style values into specs: the cluster, and a plan with dp and the global batch
derived when not given. Shared by every command that takes a plan (estimate, trial, export)."""

from __future__ import annotations

from autopar.errors import InputError
from autopar.spec.hardware import LOCAL, ClusterSpec, default_cluster, load_cluster_file
from autopar.spec.layout import first_last_layout, parse_layout, balanced_layout
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan

#: tokens per step when no global batch is given (a common pre-training setting)
DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024
#: sanity bound on every size (GPUs, degrees, batch, sequence): keeps numbers inside int64
MAX_SIZE = 1 << 30


def resolve_cluster(gpu: str = "h100-sxm", gpus_per_node: int | None = None, cluster_file: str | None = None) -> ClusterSpec:
    if cluster_file:
        cluster = load_cluster_file(cluster_file)
        if gpus_per_node:
            from dataclasses import replace

            cluster = replace(cluster, gpus_per_node=gpus_per_node)
        return cluster
    return default_cluster(gpu, gpus_per_node)


def default_dtype(cluster: ClusterSpec) -> str:
    """What the hardware trains in when the user does not say: bf16 on GPUs, fp32 on this machine's
    CPU profile (`--gpu local`), as its trials run."""
    return "fp32" if cluster.gpu.key == LOCAL else "bf16"


def default_global_batch(seq_len: int, micro_batch_size: int, dp: int) -> int:
    """The smallest multiple of mbs*dp reaching DEFAULT_TOKENS_PER_STEP tokens."""
    unit = micro_batch_size * dp
    sequences = -(-DEFAULT_TOKENS_PER_STEP // seq_len)
    return -(-sequences // unit) * unit


def resolve_plan(model: ModelSpec, num_gpus: int, seq_len: int, *, tp: int = 1, pp: int = 1, cp: int = 1,
                 dp: int | None = None, ep: int = 1, etp: int | None = None, vpp: int = 1, zero: int = 1,
                 sp: bool | None = None, mbs: int = 1, gbs: int | None = None, pp_schedule: str | None = None,
                 recompute: str = "none", recompute_layers: int | None = None, dtype: str = "bf16",
                 grads: str = "fp32", pp_layout: str | None = None, pp_first: int | None = None,
                 pp_last: int | None = None, embedding_as_layer: bool = False, loss_as_layer: bool = False,
                 tp_comm_overlap: bool = False) -> ParallelPlan:
    """A ParallelPlan from flag values. dp defaults to gpus / (tp*pp*cp); the global batch to
    DEFAULT_TOKENS_PER_STEP tokens."""
    for name, v in (("gpus", num_gpus), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp),
                    ("mbs", mbs), ("seq-len", seq_len), ("gbs", gbs), ("dp", dp)):
        if v is not None and (v <= 0 or v > MAX_SIZE):
            raise InputError(f"--{name} must be a positive integer up to {MAX_SIZE:,}, got {v}")
    if dp is None:
        if num_gpus % (tp * pp * cp):
            raise InputError(f"{num_gpus} GPUs do not divide by tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp}; "
                             f"change the degrees or --gpus")
        dp = num_gpus // (tp * pp * cp)
    if grads not in ("fp32", "bf16"):
        raise InputError(f"--grads must be fp32 (Megatron, 18 B/param) or bf16 (the seeds' 16N), got '{grads}'")
    layout = None
    if pp_layout:
        layout = parse_layout(pp_layout)
    elif pp_first is not None or pp_last is not None:
        layout = first_last_layout(model.num_layers, pp, vpp, pp_first, pp_last)
    elif embedding_as_layer or loss_as_layer:
        layout = balanced_layout(model.num_layers, pp * vpp, embedding_as_layer=embedding_as_layer,
                                 loss_as_layer=loss_as_layer)
    if gbs is None:
        gbs = default_global_batch(seq_len, mbs, max(dp, 1))
    return ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, zero_stage=zero, sequence_parallel=sp,
                        micro_batch_size=mbs, global_batch_size=gbs, pp_schedule=pp_schedule, recompute=recompute,
                        recompute_layers=recompute_layers, dtype=dtype, main_grads_fp32=grads == "fp32",
                        tp_comm_overlap=tp_comm_overlap, layout=layout)
