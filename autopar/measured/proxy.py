"""Fit a trial to the machine it runs on: the plan as is, a scaled-down proxy, or "not runnable here"
(and why); imports no torch.

A plan found for 256 GPUs cannot run as 256 ranks on a workstation. `Planner.place(plan)` compares
the trial with the limits of the machine it will run on (autopar.measured.resources: ranks and memory)
and returns a `Placement` (autopar.measured.placement holds the types, re-exported here):

- **full**: the plan runs as it is (its world and its predicted memory per rank fit, on the
  hardware the estimate is for);
- **proxy**: a scaled-down trial that keeps what the measurement is for. Kept: tp, cp and etp (so
  each rank's tensor- and context-parallel shards have the plan's split), the pipeline schedule,
  vpp and so each rank's stage program, the micro-batch size and the microbatch count per pipeline
  (the bubble), ZeRO stage, recomputation and sequence parallelism. Shrunk, in this order, until
  the proxy fits the machine's ranks and memory and its predicted step time fits the time budget:
  dp (dp >= 2 kept at 2 when there is room, so DP/ZeRO collectives still run), pp (a stand-in of
  fewer stages, at least 2: the first stage with the embedding and the last with the head and loss,
  same schedule), ep (fewer expert ranks, at least 2, each with the plan's experts per rank), layers
  per virtual stage (down to 1), then every width (hidden, head_dim, FFN, expert FFN, vocabulary;
  head counts kept, so heads per tp rank are the plan's) and the sequence (divided by 2, 4, ...,
  alternately). A model the built-in model cannot build gets a stand-in for the missing part (MLA ->
  multi-head attention of the same head count and query/key head size, ...), said in `changes`.
  On the CPU the proxy runs in fp32. The measurement is scaled back by the estimate's ratio:
  measured_full = measured_proxy x predicted_target_full / predicted_proxy_here, where "here" is
  the hardware the proxy runs on (the `local` profile on the CPU) — i.e. the target's prediction
  corrected by how far the proxy's own prediction missed on this machine.
- **not runnable**: no proxy keeps the plan's tp x cp (x 2 pipeline stages x 2 expert ranks) within
  the machine's ranks, or even the smallest proxy misses memory or time, or the built-in model cannot
  run the plan; `reason` says which and what to do (`--launcher slurm`, `--max-local-ranks`, proxy
  settings).
"""

from __future__ import annotations

import math

from autopar.calibration.estimate import estimate
from autopar.figures import PEAK_MEMORY_BYTES, STEP_TIME_S
from autopar.measured.features import model_problems, plan_problems
from autopar.measured.placement import Placement, Proxy, ProxyOptions, as_builtin, builtin_trainer
from autopar.measured.proxy_model import _halvings, _ladder, model_dict, proxy_spec, standin_model
from autopar.measured.resources import LocalLimits
from autopar.spec.hardware import GIB, LOCAL, ClusterSpec
from autopar.spec.model import ModelSpec
from autopar.spec.plan import ParallelPlan, PlanError
from autopar.spec.question import Question

__all__ = ["MAX_STRUCTURES", "Placement", "Planner", "Proxy", "ProxyOptions", "as_builtin", "builtin_trainer"]

#: proxy rank structures tried (most faithful first) before a plan is declared not runnable
MAX_STRUCTURES = 6


class Planner:
    """Places the plans of one search on this machine (or, with `limits=None`, on the cluster the
    plans are for: only the model and plan features are checked)."""

    def __init__(
        self,
        target: Question,
        limits: LocalLimits | None,
        options: ProxyOptions,
        here: ClusterSpec,
        *,
        device: str | None = None,
        fix_hint: str = "",
    ) -> None:
        self.target, self.limits, self.options, self.here = target, limits, options, here
        self.device = device or (limits.device if limits else "auto")
        on_cpu = self.device == "cpu"
        target_cpu = target.cluster.gpu.key == LOCAL
        gpu_name = limits.machine.gpu_name.lower() if limits else ""
        token = target.cluster.gpu.key.split("-")[0].lower()
        # on the cluster (limits None) the trials run on the plans' own hardware
        self.cross_hardware = limits is not None and (
            (on_cpu != target_cpu)
            or (self.device == "cuda" and bool(gpu_name) and token not in gpu_name.replace(" ", "").replace("-", ""))
        )
        self.fix_hint = fix_hint  # what to do when a plan cannot run here (the CLI's flags)
        self.base_model, self.substitutions = standin_model(target.model)
        self._cache: dict[str, Placement] = {}

    # ---- public ------------------------------------------------------------------------------

    def place(self, plan: dict, predicted: dict | None = None) -> Placement:
        key = repr(sorted((k, str(v)) for k, v in plan.items()))
        if key not in self._cache:
            self._cache[key] = self._place(plan, predicted)
        return self._cache[key]

    def min_ranks(self, plan: dict) -> int:
        """Fewest ranks a faithful proxy of the plan needs: tp x cp x (2 pipeline stages) x (the
        expert ranks EP needs beyond them)."""
        p = ParallelPlan.from_dict(plan)
        pp = min(p.pp, 2)
        dp = 1
        if p.ep > 1:  # (etp: an int once ParallelPlan.__post_init__ has resolved None to tp)
            while (p.tp * p.cp * dp) % (min(p.ep, 2) * p.etp):  # type: ignore[operator]
                dp += 1
        return p.tp * p.cp * pp * dp

    # ---- the decision ------------------------------------------------------------------------

    def _not(self, plan: dict, why: str, fix: str | None = None) -> Placement:
        fix = self.fix_hint if fix is None else fix
        return Placement(plan=plan, kind="not-runnable", reason=why + (f"; {fix}" if fix else ""))

    def _place(self, plan_d: dict, predicted: dict | None) -> Placement:
        t, opts = self.target, self.options
        try:
            plan = ParallelPlan.from_dict(plan_d)
        except PlanError as e:
            return self._not(plan_d, str(e), "")
        structural = [p for p in plan_problems(plan, t.model) if "fp8" not in p]
        if structural:
            return self._not(
                plan_d,
                "the built-in model cannot run this plan: " + "; ".join(structural),
                "`autopar estimate` predicts it",
            )
        left = model_problems(self.base_model)
        if left:
            return self._not(plan_d, f"the built-in model cannot build {t.model.name}: " + "; ".join(left), "")
        if predicted is None or STEP_TIME_S not in predicted:
            est = estimate(plan, t.model, t.cluster, num_gpus=t.num_gpus, seq_len=t.seq_len)
            predicted = {STEP_TIME_S: est.step_time_s, PEAK_MEMORY_BYTES: est.peak_memory_bytes}
        full = self._full(plan, predicted)
        if full is not None:
            return full
        if not opts.enabled:
            return self._not(
                plan_d,
                self._why_not_full(plan, predicted),
                "drop --no-proxy to run a scaled-down proxy" + (f", or {self.fix_hint}" if self.fix_hint else ""),
            )
        return self._proxy(plan, predicted)

    def _changes_needed(self, plan: ParallelPlan) -> list[str]:
        """What must change for the plan to run here at all (model stand-ins, dtype)."""
        out = list(self.substitutions)
        if self.device == "cpu" and plan.dtype != "fp32":
            out.append(f"fp32 on the CPU for {plan.dtype}")
        elif plan.dtype == "fp8":
            out.append("bf16 for fp8 (not built)")
        if self.cross_hardware:
            out.append(f"measured on {self._here_name()} for {self.target.cluster.gpu.key}")
        return out

    def _here_name(self) -> str:
        if self.limits is None:
            return "the cluster"
        return "this CPU" if self.device == "cpu" else (self.limits.machine.gpu_name or "this GPU")

    def _full(self, plan: ParallelPlan, predicted: dict) -> Placement | None:
        """The plan as is, when nothing needs to change and it fits."""
        t = self.target
        # fewer microbatches than stages: Megatron runs it, torch.distributed.pipelining refuses it
        few = plan.pp > 1 and plan.num_microbatches < plan.pp
        if self._changes_needed(plan) or plan.tp_comm_overlap or few:
            return None
        if self.limits is not None:
            if t.num_gpus > self.limits.max_ranks:
                return None
            if not self.limits.memory_fits(t.num_gpus, float(predicted[PEAK_MEMORY_BYTES])):
                return None
        return Placement(
            plan=plan.to_dict(),
            kind="full",
            nproc=t.num_gpus,
            model=model_dict(t.model),
            run_plan=as_builtin(plan).to_dict(),
            seq_len=t.seq_len,
            device=self.device,
        )

    def _why_not_full(self, plan: ParallelPlan, predicted: dict) -> str:
        t, lim = self.target, self.limits
        why = []
        if lim is not None and t.num_gpus > lim.max_ranks:
            why.append(f"{t.num_gpus} ranks, this machine runs at most {lim.max_ranks} ({lim.why})")
        elif lim is not None and not lim.memory_fits(t.num_gpus, float(predicted[PEAK_MEMORY_BYTES])):
            why.append(
                f"{float(predicted[PEAK_MEMORY_BYTES]) / GIB:.1f} GiB per rank, this machine allows "
                f"{lim.memory_text(t.num_gpus)}"
            )
        why += self._changes_needed(plan)
        if plan.tp_comm_overlap:
            why.append("tensor-parallel communication overlap, which the built-in model does not do")
        return "it cannot run here as it is: " + "; ".join(why)

    # ---- proxies -----------------------------------------------------------------------------

    def _structures(self, plan: ParallelPlan) -> list[tuple[int, int, int]]:
        """(pp, dp, ep) of the proxy ranks that fit, most faithful first."""
        lim = self.limits.max_ranks if self.limits else plan.num_gpus
        m = plan.num_microbatches
        pps = (
            [plan.pp]
            if plan.pp == 1
            else [p for p in range(plan.pp, 1, -1) if plan.pp_schedule != "interleaved-1f1b" or m % p == 0]
        )
        eps = [1] if plan.ep == 1 else list(range(plan.ep, 1, -1))
        out = []
        for pp in pps:
            for ep in eps:
                for dp in range(1, plan.dp + 1):
                    world = plan.tp * plan.cp * pp * dp
                    if world > lim:
                        break
                    if (plan.tp * plan.cp * dp) % (ep * plan.etp):  # type: ignore[operator]  # etp: an int
                        continue
                    out.append((pp, dp, ep))

        def score(s):
            return s[0] == plan.pp, s[2] == plan.ep, s[0], s[2], s[1] == plan.dp, min(s[1], 2), -s[0] * s[1]

        return sorted(out, key=score, reverse=True)

    def _proxy(self, plan: ParallelPlan, predicted: dict) -> Placement:
        t, opts = self.target, self.options
        structures = self._structures(plan)
        if not structures:
            need = self.min_ranks(plan.to_dict())
            parts = (
                [f"tp{plan.tp}"] * (plan.tp > 1)
                + [f"cp{plan.cp}"] * (plan.cp > 1)
                + (["2 pipeline stages"] if plan.pp > 1 else [])
                + (["2 expert ranks"] if plan.ep > 1 else [])
            )
            lim = self.limits
            fix = self.fix_hint
            if lim is not None and lim.device == "cpu":
                fix = (fix + ", or " if fix else "") + f"--max-local-ranks {need} (oversubscribes the cores)"
            return self._not(
                plan.to_dict(),
                f"a faithful proxy keeps {' x '.join(parts) or 'one rank'} = {need} ranks; "
                f"this machine runs at most {lim.max_ranks if lim else plan.num_gpus} "
                f"({lim.why if lim else 'the plan'})",
                fix,
            )
        layout = plan.resolved_layout(t.model.num_layers)
        lps_max = max(1, max(layout.stages))
        tp_mult: int = max(plan.tp, plan.etp)  # type: ignore[type-var, assignment]  # etp: an int
        base = self.base_model
        widths = _halvings(opts.width_divisor, base.head_dim * base.num_kv_heads // (2 * plan.tp))
        seq_limit = max(1, t.seq_len // (2 * plan.cp * plan.tp))
        seqs = _halvings(opts.seq_divisor, seq_limit)
        ladder = _ladder(lps_max, widths, seqs, opts.layers_per_stage)
        first_miss = None  # why the most faithful structure's smallest proxy does not fit
        for pp, dp, ep in structures[:MAX_STRUCTURES]:
            miss = None
            for lps, wd, sd in ladder:
                got = self._try(plan, predicted, pp, dp, ep, lps, wd, sd, tp_mult)
                if isinstance(got, Placement):
                    return got
                miss = got or miss
            first_miss = first_miss or miss
        why = first_miss or "no proxy size divides the model's shapes"
        return self._not(
            plan.to_dict(),
            why,
            (self.fix_hint + ", or " if self.fix_hint else "")
            + "--proxy-width/--proxy-seq/--proxy-layers, or a longer --trial-timeout",
        )

    def _try(
        self, plan: ParallelPlan, predicted: dict, pp: int, dp: int, ep: int, lps: int, wd: int, sd: int, tp_mult: int
    ) -> Placement | str | None:
        """The proxy at one rung: a Placement if it fits, why not if it does not, None if invalid."""
        t = self.target
        if t.seq_len % sd:
            return None
        seq = t.seq_len // sd
        spec = proxy_spec(
            self.base_model,
            f"{t.model.name}-proxy",
            width_divisor=wd,
            round_to=tp_mult,
            plan=plan,
            ep=ep,
            num_layers=pp * plan.vpp * lps,
            seq_len=seq,
        )
        if spec is None:
            return None
        small = self._proxy_plan(plan, pp, dp, ep, lps)
        if small is None:
            return None
        world = small.num_gpus
        if small.problems(spec, num_gpus=world, seq_len=seq) or plan_problems(small, spec):
            return None
        est = estimate(small, spec, self.here, num_gpus=world, seq_len=seq)
        peak, step = float(est.peak_memory_bytes), float(est.step_time_s)
        miss = self._misses(world, peak, step, lps, wd, sd)
        if miss:
            return miss
        proxy = Proxy(
            changes=tuple(self._proxy_changes(plan, spec, small, lps, wd, sd)),
            nproc=world,
            layers_per_stage=lps,
            width_divisor=wd,
            seq_divisor=sd,
            here=self.here.name or self.here.gpu.key,
            cross_hardware=self.cross_hardware,
            predicted_step_time_s=step,
            predicted_peak_memory_bytes=peak,
            time_ratio=float(predicted[STEP_TIME_S]) / step if step > 0 else math.nan,
            memory_ratio=float(predicted[PEAK_MEMORY_BYTES]) / peak if peak > 0 else math.nan,
        )
        return Placement(
            plan=plan.to_dict(),
            kind="proxy",
            nproc=world,
            model=model_dict(spec),
            run_plan=small.to_dict(),
            seq_len=seq,
            device=self.device,
            proxy=proxy,
        )

    def _proxy_plan(self, plan: ParallelPlan, pp: int, dp: int, ep: int, lps: int) -> ParallelPlan | None:
        """The plan the proxy runs (pp, dp, ep shrunk; as many microbatches of the same size per
        pipeline; what is not built dropped), or None when that is not a valid plan."""
        zero = plan.zero_stage if dp * plan.cp > 1 else 0
        rl = plan.recompute_layers
        try:
            return as_builtin(
                plan.with_(
                    pp=pp,
                    dp=dp,
                    ep=ep,
                    # torch.distributed.pipelining runs at least one microbatch per stage
                    global_batch_size=max(plan.num_microbatches, pp if pp > 1 else 1) * plan.micro_batch_size * dp,
                    layout=None,
                    zero_stage=zero,
                    tp_comm_overlap=False,
                    dtype="fp32" if self.device == "cpu" else ("bf16" if plan.dtype == "fp8" else plan.dtype),
                    recompute_layers=None if rl is None else min(rl, plan.vpp * lps),
                )
            )
        except PlanError:
            return None

    def _misses(self, world: int, peak: float, step: float, lps: int, wd: int, sd: int) -> str | None:
        """Why a proxy of `world` ranks predicted at `peak` bytes per rank and `step` seconds does not
        fit this machine's memory or the time budget; None when it fits."""
        lim, budget = self.limits, self.options.step_budget_s
        if lim is not None and not lim.memory_fits(world, peak):
            return (
                f"even the smallest proxy ({self._rung_text(lps, wd, sd)}, {world} ranks) needs "
                f"{peak / GIB:.2f} GiB per rank; this machine allows {lim.memory_text(world)}"
            )
        if budget is not None and step > budget:
            return (
                f"even the smallest proxy ({self._rung_text(lps, wd, sd)}, {world} ranks) is predicted "
                f"{step:.2f} s per step here, over the {budget:.2f} s a trial's timeout allows"
            )
        return None

    def _proxy_changes(
        self, plan: ParallelPlan, spec: ModelSpec, small: ParallelPlan, lps: int, wd: int, sd: int
    ) -> list[str]:
        """Every difference of the proxy (model `spec`, plan `small`) from the plan, in words."""
        t = self.target
        world, pp, dp, ep, layers = small.num_gpus, small.pp, small.dp, small.ep, spec.num_layers
        changes = self._changes_needed(plan)
        if world != t.num_gpus:
            changes.append(f"{world} of {t.num_gpus} ranks")
        if pp != plan.pp:
            changes.append(f"pp {plan.pp} -> {pp} (stand-in stages, same schedule)")
        if dp != plan.dp:
            changes.append(f"dp {plan.dp} -> {dp}")
        if small.num_microbatches != plan.num_microbatches:
            changes.append(
                f"{small.num_microbatches} microbatches for {plan.num_microbatches} (torch.distributed.pipelining "
                f"runs at least one per stage)"
            )
        if ep != plan.ep:
            assert spec.moe is not None  # only a MoE model's proxy changes ep
            experts = spec.moe.num_experts
            changes.append(f"ep {plan.ep} -> {ep} ({experts} experts, {experts // ep} per rank as planned)")
        if layers != t.model.num_layers:
            changes.append(f"{layers} layer{'s' * (layers != 1)} ({lps} per stage)")
        if wd > 1:
            changes.append(
                f"{wd}x narrower (hidden {spec.hidden_size}, {spec.num_attention_heads} heads of "
                f"{spec.head_dim}, {spec.num_kv_heads} KV)"
            )
        if sd > 1:
            changes.append(f"sequence {spec.seq_len} (/{sd})")
        if plan.layout is not None and pp == plan.pp and len(set(plan.layout.stages)) > 1:
            changes.append("even stages for the uneven layout")
        if plan.tp_comm_overlap:
            changes.append("no TP communication overlap (not built)")
        return changes

    @staticmethod
    def _rung_text(lps: int, wd: int, sd: int) -> str:
        return (
            f"{lps} layer{'s' * (lps != 1)} per stage"
            + (f", {wd}x narrower" if wd > 1 else "")
            + (f", sequence /{sd}" if sd > 1 else "")
        )
