"""Run one trial on every rank: build, parallelise, train N steps, measure; rank 0 gets the result.

Measured per rank: wall time of each step (after a barrier, so a step does not absorb the previous
one's stragglers), peak memory over the steps after warm-up (autopar.trial.memory), parameters held
under TP (before ZeRO sharding: the cost model's per-GPU count), and the collective payload bytes
per mesh axis of the last step (autopar.trial.comm_count; counted apart, since the counting mode
slows the step, and left out of the timing statistics when other steps are timed).

`on_step(step, time_s, timed)`, when given (on every rank: it costs one all-reduce per step, after
the timed region), is called on rank 0 as each step ends with the slowest rank's time, the value
the result reports, so a caller can watch or prune the trial while it runs.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from autopar.cost.flops import model_flops_per_step, padded_vocab
from autopar.figures import MODEL_FLOPS_PER_STEP, NUM_MICROBATCHES, STEP_TIME_S, TOKENS_PER_S
from autopar.measured.config import TrialConfig
from autopar.measured.features import plan_problems
from autopar.spec.plan import MESH_ORDER
from autopar.spec.trainers import BUILTIN
from autopar.trial.batch import cp_share, dp_share, synthetic_batch
from autopar.trial.comm_count import CommBytesMode
from autopar.trial.loss import cross_entropy, loss_context
from autopar.trial.memory import PeakMemory
from autopar.trial.mesh import Runtime, axis_ranks, build_mesh
from autopar.trial.model import ModelConfig, Transformer
from autopar.trial.optim import make_optimizer
from autopar.trial.parallel.data import microbatch_context
from autopar.trial.parallel.expert import rows_logs, stop_rows_logs
from autopar.trial.parallelize import ParallelModel, parallelize


class TrialError(ValueError):
    """A trial that cannot run (invalid plan for the model, or a feature not built)."""


@dataclass
class RankReport:
    """What one rank measured (gathered to rank 0)."""

    rank: int
    coords: dict[str, int]  # mesh coordinates: pp, dp, cp, tp
    stages: list[int]  # virtual pipeline stages held
    param_count: int
    step_times_s: list[float]
    peak_memory_bytes: int
    peak_memory_delta_bytes: int
    memory_method: str
    comm: dict | None = None  # CommCount.to_dict() of the counted step
    extra: dict = field(default_factory=dict)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(pm: ParallelModel, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """Forward + backward of this rank's share of the global batch; returns the mean loss over its
    microbatches on ranks that compute the loss (the last stage), else None."""
    plan = pm.plan
    if pm.schedule is not None:
        losses: list[torch.Tensor] = []
        kwargs = {"target": targets, "losses": losses} if pm.is_last else {}
        pm.schedule.step(*((tokens,) if pm.is_first else ()), **kwargs)
        return torch.stack([_local(x).detach() for x in losses]).mean() if pm.is_last else None
    module = pm.stages[0][1]
    m = plan.num_microbatches
    total = torch.zeros((), device=tokens.device)
    for i, (x, y) in enumerate(zip(tokens.split(plan.micro_batch_size), targets.split(plan.micro_batch_size))):
        with microbatch_context(module, plan.zero_stage, last=i == m - 1):
            loss = cross_entropy(module(x), y)
            (loss / m).backward()  # the mean over microbatches, as the pipeline schedules scale
        total = total + _local(loss).detach()
    return total / m


def _step_context(pm: ParallelModel, device: torch.device) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(loss_context(pm.plan.tp > 1))  # vocab-parallel cross-entropy, forward and backward
    if pm.plan.dtype == "bf16":
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
    return stack


def _global_losses(local: list[torch.Tensor | None], pm: ParallelModel, device: torch.device) -> list[float]:
    """Mean loss over the global batch per step: the last stage's ranks hold it (tp copies, dp shares)."""
    plan = pm.plan
    vals = torch.zeros(len(local), dtype=torch.float64, device=device)
    if pm.is_last:  # which has every step's loss
        held = cast("list[torch.Tensor]", local)
        vals = torch.stack([x.double() for x in held]) / (plan.dp * plan.tp * plan.cp)
    dist.all_reduce(vals)
    return vals.tolist()


def build(cfg: TrialConfig, runtime: Runtime) -> tuple[ParallelModel, ModelConfig]:
    """The trial's model, parallelised on a fresh mesh over all ranks."""
    plan, spec = cfg.parallel_plan(), cfg.model_spec()
    seq = cfg.sequence_length
    # whatever trainer the plan was searched for, a trial runs the built-in model: its capabilities apply
    runs = plan.with_(trainer=BUILTIN)
    problems = runs.problems(spec, num_gpus=dist.get_world_size(), seq_len=seq) + plan_problems(runs, spec)
    if problems:
        raise TrialError(f"{cfg.label}: " + "; ".join(problems))
    if runtime.device.type == "cpu" and plan.dtype != "fp32":
        raise TrialError(f"{cfg.label}: use dtype fp32 on CPU (bf16 parity needs a GPU)")
    mesh = build_mesh(plan, runtime)
    config = ModelConfig(
        spec=spec,
        vocab_rows=int(padded_vocab(spec, plan.tp)),
        max_seq_len=seq,
        moe_routing=cfg.moe_routing,
        moe_capacity_factor=cfg.moe_capacity_factor,
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff,
    )
    with torch.device("meta"):
        model = Transformer(config)
    return parallelize(model, plan, mesh, device=runtime.device, seed=cfg.seed), config


def timed_steps(cfg: TrialConfig, count_step: int) -> list[int]:
    """The steps the statistics use: after warm-up, not the byte-counting one (else the last)."""
    return [i for i in range(cfg.warmup, cfg.steps) if i != count_step] or [cfg.steps - 1]


def run_trial(
    cfg: TrialConfig,
    runtime: Runtime,
    *,
    on_step: Callable[[int, float, bool], None] | None = None,
    step_delay_s: float = 0.0,
) -> dict | None:
    """Run the trial on this rank (all ranks call it); the result dict on rank 0, None elsewhere.
    `step_delay_s` is added inside every step (a deliberately slow plan, for the pruner's tests)."""
    pm, config = build(cfg, runtime)
    device = runtime.device
    coords = {axis: pm.mesh.get_local_rank(axis) for axis in MESH_ORDER}
    opt = make_optimizer(list(pm.params.values()), cfg.optimizer, cfg.lr)
    axes = axis_ranks(pm.mesh, pm.expert_mesh) | pm.named_axes
    moes = [b.moe for m in pm.unwrapped for _, b in m.blocks() if b.moe is not None]
    mem = PeakMemory(device)
    count_step = cfg.steps - 1 if cfg.count_comm else -1
    timed = set(timed_steps(cfg, count_step))
    mem_start = min(cfg.warmup, cfg.steps - 1)
    times: list[float] = []
    local_losses: list[torch.Tensor | None] = []
    comm = None
    extra: dict = {}
    for step in range(cfg.steps):
        tokens, targets = _rank_batch(cfg, pm, config.spec.vocab_size, coords["dp"], step, device)
        if step == count_step:  # EP: rows sent and received by each dispatch of the counted step
            logs = rows_logs(moes)
        if step == mem_start:
            mem.reset()
        dist.barrier()
        _sync(device)
        counting = CommBytesMode(axes) if step == count_step else contextlib.nullcontext()
        t0 = time.perf_counter()
        with counting, _step_context(pm, device):
            loss = train_step(pm, tokens, targets)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step_delay_s:
                time.sleep(step_delay_s)
        _sync(device)
        times.append(time.perf_counter() - t0)
        local_losses.append(loss)
        if on_step is not None:
            _report_step(on_step, step, times[-1], step in timed, device)
        if step == count_step:
            assert isinstance(counting, CommBytesMode)  # the counted step's context
            comm = counting.count.to_dict()
            extra |= _ep_rows(logs)
            stop_rows_logs(moes)
    peak, delta, method = mem.peak()
    losses = _global_losses(local_losses, pm, device)
    report = RankReport(
        rank=dist.get_rank(),
        coords=coords,
        stages=[i for i, _ in pm.stages],
        param_count=pm.param_count,
        step_times_s=times,
        peak_memory_bytes=peak,
        peak_memory_delta_bytes=delta,
        memory_method=method,
        comm=comm,
        extra=extra,
    )
    reports, gathered = _gather_to_rank0(cfg, pm, coords, report)
    if dist.get_rank() != 0:
        return None
    return _result(cfg, pm, config, reports, losses, gathered, count_step)


def _rank_batch(
    cfg: TrialConfig, pm: ParallelModel, vocab_size: int, dp_rank: int, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share (its dp share, its cp positions) of the step's synthetic global batch."""
    plan = pm.plan
    tokens, targets = synthetic_batch(cfg.seed, step, plan.global_batch_size, cfg.sequence_length, vocab_size)
    tokens = cp_share(dp_share(tokens, plan, dp_rank), pm.positions).to(device)
    targets = cp_share(dp_share(targets, plan, dp_rank), pm.positions).to(device)
    return tokens, targets


def _report_step(
    on_step: Callable[[int, float, bool], None], step: int, time_s: float, timed: bool, device: torch.device
) -> None:
    """Hand the slowest rank's time of `step` to `on_step` on rank 0 (a collective: every rank calls it)."""
    slowest = torch.tensor([time_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        on_step(step, float(slowest.item()), timed)


def _ep_rows(logs: list) -> dict:
    """The EP dispatch figures of the counted step: rows sent and received, and dispatches."""
    rows = [r for log in logs for r in log]
    if not rows:
        return {}
    return {
        "ep_rows_sent": sum(r[0] for r in rows),
        "ep_rows_received": sum(r[1] for r in rows),
        "ep_dispatches": len(rows),
    }


def _gather_to_rank0(cfg: TrialConfig, pm: ParallelModel, coords: dict, report: RankReport) -> tuple[list, list]:
    """Every rank's report, and with a parity check every stage's full parameters, gathered on rank 0
    (a collective: every rank calls it; the lists are filled on rank 0 only)."""
    parity_params = pm.full_params() if cfg.check_parity else None
    reports: list = [None] * dist.get_world_size()
    dist.gather_object(asdict(report), reports if dist.get_rank() == 0 else None, dst=0)
    # parameters: one copy per pipeline stage (tp and dp ranks hold the same full values)
    shared = parity_params if (coords["tp"] == 0 and coords["dp"] == 0) else None
    gathered: list = [None] * dist.get_world_size()
    if cfg.check_parity:
        dist.gather_object(shared, gathered if dist.get_rank() == 0 else None, dst=0)
    return reports, gathered


def _result(
    cfg: TrialConfig,
    pm: ParallelModel,
    config: ModelConfig,
    reports: list[dict],
    losses: list[float],
    gathered: list,
    count_step: int,
) -> dict:
    """Rank 0's result document for one trial."""
    plan, seq = pm.plan, cfg.sequence_length
    timed = timed_steps(cfg, count_step)
    step_time = [max(r["step_times_s"][i] for r in reports) for i in range(cfg.steps)]  # the slowest rank
    mean_time = statistics.fmean(step_time[i] for i in timed)
    tokens = plan.global_batch_size * seq
    result = {
        "name": cfg.label,
        "status": "ok",
        "config": cfg.to_dict(),
        "plan": plan.to_dict(),
        "model": config.spec.to_dict() | {"name": config.spec.name},
        "vocab_rows": config.vocab_rows,
        "seq_len": seq,
        "world_size": plan.num_gpus,
        NUM_MICROBATCHES: plan.num_microbatches,
        STEP_TIME_S: step_time,
        "timed_steps": timed,
        "mean_step_time_s": mean_time,
        "tokens_per_step": tokens,
        TOKENS_PER_S: tokens / mean_time,
        MODEL_FLOPS_PER_STEP: float(model_flops_per_step(config.spec, plan.global_batch_size, seq, plan.tp)),
        "losses": losses,
        "final_loss": losses[-1],
        "ranks": reports,
        "comm_step": count_step if count_step >= 0 else None,
    }
    if cfg.check_parity:
        from autopar.trial.parity import compare

        params: dict = {}
        for part in gathered:
            params.update(part or {})
        result["parity"] = compare(cfg, config, plan.global_batch_size, losses, params)
    return result
