"""Validity rules of a plan for a model, GPU count and cluster, vectorised over a table of plans
(autopar.spec.plan_fields.PlanColumns: a PlanTable, or one plan as a table of one row).

Each rule is a mask over the table and a sentence for a violating row. The scalar
`ParallelPlan.problems` runs the same rules on a one-row table, so the search and `autopar
estimate` can never disagree about what is valid. Sources: Megatron-LM arguments.py and
Megatron-Core asserts (divisibility of heads, query groups, experts, batch), Megatron's interleaved
schedule (microbatches % pp), load-balanced causal CP (sequence in 2*cp chunks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autopar.spec.fp8_recipes import RECIPE_CHOICES, RECIPES, recipe_of
from autopar.spec.fp8_recipes import SOURCE as FP8_SOURCE
from autopar.spec.hardware import ClusterSpec, GpuSpec
from autopar.spec.model import ModelSpec, MoESpec
from autopar.spec.offload_modules import SOURCE as OFFLOAD_SOURCE
from autopar.spec.offload_modules import lacking_offload, parse_offload_modules
from autopar.spec.plan_fields import DTYPE, RECOMP, SCHED, PlanColumns, plan_fields
from autopar.spec.recompute_modules import MODULES, NEEDS, lacking_modules, parse_modules
from autopar.spec.recompute_modules import SOURCE as MODULES_SOURCE
from autopar.spec.stages import StageProfiles, stage_profiles
from autopar.spec.trainer_rules import trainer_rules


@dataclass
class Context:
    model: ModelSpec
    num_gpus: int | None
    cluster: ClusterSpec | None
    seq_len: int
    stages: StageProfiles
    #: the trainers the question names a recipe for (`search --recipe`): their preset -> recipe line
    #: does not apply (autopar.spec.trainer_rules "recipes")
    recipes: frozenset[str] = frozenset()

    @property
    def moe(self) -> MoESpec:
        """The model's MoE layers (the rules that read them are those of an MoE model)."""
        assert self.model.moe is not None, "an MoE rule on a dense model"
        return self.model.moe

    @property
    def gpu(self) -> GpuSpec:
        """The cluster's GPU (the rules that read it are those checked against a cluster)."""
        assert self.cluster is not None, "a hardware rule without a cluster"
        return self.cluster.gpu


def _recipe_off_gpu(t: PlanColumns, c: Context) -> np.ndarray:
    """Per row: an FP8 plan whose recipe lacks kernels for the cluster's GPU generation (code 0, the
    trainer's default, runs on every FP8 GPU); none without a cluster."""
    if c.cluster is None:
        return np.zeros(len(t.dtype), bool)
    gpu = c.cluster.gpu
    off = np.array([False] + [bool(r.generations) and gpu.generation not in r.generations for r in RECIPES])
    return (t.dtype == DTYPE["fp8"]) & off[t.fp8_recipe]


@dataclass(frozen=True)
class Rule:
    name: str
    violated: Callable[[PlanColumns, Context], np.ndarray]
    explain: Callable[[dict, Context], str]
    #: the rule in words, where its name is a formula ("microbatches%pp"): what a count of the plans
    #: it rejects reads as (`rule_words`)
    words: str = ""


def _moe(c: Context) -> bool:
    return c.model.moe is not None


def _module_needs(r: dict, c: Context) -> str:
    name = parse_modules(int(r["recompute_modules"]) & lacking_modules(c.model))[0]
    what = NEEDS[next(m.needs for m in MODULES if m.name == name)]
    return (
        f"recompute module {name} needs {what}; {c.model.name} has none: drop it from --recompute-modules "
        f"({MODULES_SOURCE})"
    )


def _host_figures(gpu: GpuSpec) -> bool:
    """The GPU states what an offload to host memory travels over and streams through."""
    return gpu.host_link_gbps is not None and gpu.host_memory_gbps is not None


def _interleaved(t: PlanColumns) -> np.ndarray:
    return t.pp_schedule == SCHED["interleaved-1f1b"]


RULES: tuple[Rule, ...] = (
    Rule(
        "gpus",
        lambda t, c: (t.num_gpus != c.num_gpus) if c.num_gpus else np.zeros(len(t), bool),
        lambda r, c: (
            f"tp*pp*cp*dp = {r['tp']}*{r['pp']}*{r['cp']}*{r['dp']} = "
            f"{r['tp'] * r['pp'] * r['cp'] * r['dp']} is not the {c.num_gpus} GPUs; change dp"
        ),
        words="tp x pp x cp x dp is not the GPU count",
    ),
    Rule(
        "heads%tp",
        lambda t, c: c.model.num_attention_heads % t.tp != 0,
        lambda r, c: f"{c.model.num_attention_heads} attention heads do not divide by tp={r['tp']}",
        words="attention heads do not divide by tp",
    ),
    Rule(
        "kv_heads%tp",
        lambda t, c: c.model.kv_heads_effective % t.tp != 0,
        lambda r, c: (
            f"{c.model.kv_heads_effective} KV heads do not divide by tp={r['tp']} "
            f"(Megatron-Core shards query groups over tp); use tp <= {c.model.kv_heads_effective}"
        ),
        words="KV heads do not divide by tp",
    ),
    Rule(
        "ffn%tp",
        lambda t, c: c.model.ffn_hidden_size % t.tp != 0,
        lambda r, c: f"FFN hidden size {c.model.ffn_hidden_size} does not divide by tp={r['tp']}",
        words="FFN size does not divide by tp",
    ),
    Rule("layout", lambda t, c: c.stages.layout_problem != "", lambda r, c: str(c.stages.layout_problem[r["_i"]])),
    Rule(
        "vpp",
        lambda t, c: ((t.vpp > 1) & ~_interleaved(t)) | (_interleaved(t) & (t.vpp == 1)) | ((t.vpp > 1) & (t.pp == 1)),
        lambda r, c: (
            "vpp > 1 needs pp > 1"
            if r["pp"] == 1
            else "vpp > 1 needs the interleaved-1f1b schedule"
            if r["vpp"] > 1
            else "the interleaved-1f1b schedule needs vpp > 1"
        ),
        words="vpp and the schedule disagree",
    ),
    Rule(
        "microbatches%pp",
        lambda t, c: _interleaved(t) & (t.num_microbatches % t.pp != 0),
        lambda r, c: (
            f"interleaved 1F1B needs microbatches ({r['_m']}) to be a multiple of pp={r['pp']} "
            f"(Megatron schedules.py); change the global batch"
        ),
        words="microbatches not a multiple of pp (interleaved 1F1B)",
    ),
    Rule(
        "seq%cp",
        lambda t, c: (t.cp > 1) & (c.seq_len % (2 * t.cp) != 0),
        lambda r, c: (
            f"sequence {c.seq_len} does not split into 2*cp = {2 * r['cp']} chunks "
            f"(load-balanced causal context parallelism)"
        ),
        words="sequence does not split into 2 x cp chunks",
    ),
    Rule(
        "seq%sp",
        lambda t, c: t.sequence_parallel.astype(bool) & ((c.seq_len % t.cp != 0) | ((c.seq_len // t.cp) % t.tp != 0)),
        lambda r, c: (
            f"sequence parallelism splits the {c.seq_len // r['cp']} local tokens over tp={r['tp']}, "
            f"which does not divide"
        ),
        words="local tokens do not divide by tp (sequence parallelism)",
    ),
    Rule(
        "sp_needs_tp",
        lambda t, c: t.sequence_parallel.astype(bool) & (t.tp == 1),
        lambda r, c: "sequence parallelism needs tp > 1 (Megatron turns it off at tp = 1)",
        words="sequence parallelism without tp",
    ),
    Rule(
        "ep_needs_moe",
        lambda t, c: (t.ep > 1) & (not _moe(c) or c.model.num_moe_layers == 0),
        lambda r, c: (
            f"ep={r['ep']} needs a mixture-of-experts layer; {c.model.name} "
            + (
                "is dense"
                if not _moe(c)
                else f"has none (moe.first_k_dense {c.moe.first_k_dense} covers its {c.model.num_layers} layers)"
            )
        ),
        words="expert parallelism on a dense model",
    ),
    Rule(
        "experts%ep",
        lambda t, c: (c.moe.num_experts % t.ep != 0) if _moe(c) else np.zeros(len(t), bool),
        lambda r, c: f"{c.moe.num_experts} experts do not divide by ep={r['ep']}",
        words="experts do not divide by ep",
    ),
    Rule(
        "ep*etp|tp*cp*dp",
        lambda t, c: ((t.tp * t.cp * t.dp) % (t.ep * t.etp) != 0) if _moe(c) else (t.etp != t.tp),
        lambda r, c: (
            (
                f"ep*etp = {r['ep'] * r['etp']} must divide tp*cp*dp = {r['tp'] * r['cp'] * r['dp']} "
                f"(EP is carved out of the dp x cp (x tp) ranks)"
            )
            if _moe(c)
            else "etp only applies to mixture-of-experts models"
        ),
        words="ep x etp does not divide tp x cp x dp",
    ),
    Rule(
        "expert_ffn%etp",
        lambda t, c: (c.moe.expert_ffn_hidden_size % t.etp != 0) if _moe(c) else np.zeros(len(t), bool),
        lambda r, c: f"expert FFN size {c.moe.expert_ffn_hidden_size} does not divide by etp={r['etp']}",
        words="expert FFN size does not divide by etp",
    ),
    Rule(
        "moe_needs_sp",
        lambda t, c: ((t.tp > 1) & ~t.sequence_parallel.astype(bool)) if _moe(c) else np.zeros(len(t), bool),
        lambda r, c: "MoE with tp > 1 needs sequence parallelism (Megatron-Core asserts it)",
        words="MoE at tp > 1 without sequence parallelism",
    ),
    Rule(
        "gbs%(mbs*dp)",
        lambda t, c: (
            (t.global_batch_size % (t.micro_batch_size * t.dp) != 0) | (t.global_batch_size < t.micro_batch_size * t.dp)
        ),
        lambda r, c: (
            f"global batch {r['global_batch_size']} is not a multiple of micro-batch*dp = "
            f"{r['micro_batch_size']}*{r['dp']} = {r['micro_batch_size'] * r['dp']}"
        ),
        words="global batch not a multiple of micro-batch x dp",
    ),
    Rule(
        "dp_shard",
        lambda t, c: (
            (t.dp_shard > 0)
            & (((t.dp * t.cp) % np.maximum(t.dp_shard, 1) != 0) | (t.zero_stage == 0) | (c.model.moe is not None))
        ),
        lambda r, c: (
            "hybrid sharding (--dp-shard) of a mixture-of-experts model is not priced (experts shard over "
            "their expert-data-parallel group); leave --dp-shard out"
            if _moe(c)
            else "hybrid sharding (--dp-shard) needs ZeRO 1, 2 or 3: ZeRO 0 shards nothing"
            if r["zero_stage"] == 0
            else f"dp shard {r['dp_shard']} does not divide the {r['dp'] * r['cp']} data-parallel ranks (dp x cp)"
        ),
        words="hybrid-sharding group does not fit",
    ),
    Rule(
        "optimizer_offload_zero0",
        lambda t, c: (t.optimizer_offload > 0) & (t.zero_stage == 0),
        lambda r, c: "optimizer offload needs ZeRO 1, 2 or 3 (the sharded optimizer is what moves to the host)",
    ),
    Rule(
        "optimizer_offload_host",
        lambda t, c: (t.optimizer_offload > 0) & (c.cluster is not None and not _host_figures(c.cluster.gpu)),
        lambda r, c: (
            f"optimizer offload needs the host link and host memory bandwidth of the GPU '{c.gpu.key}', which "
            f"are not stated; set host_link_gbps and host_memory_gbps in the cluster file's gpu mapping, or "
            f"drop --optimizer-offload"
        ),
    ),
    Rule(
        "grads_bf16_fp32",
        lambda t, c: ~t.main_grads_fp32 & (t.dtype == DTYPE["fp32"]),
        lambda r, c: "bf16 main gradients need a 16-bit model (fp32 training keeps fp32 gradients); drop --grads bf16",
    ),
    Rule(
        "fp8",
        lambda t, c: (t.dtype == DTYPE["fp8"]) & (c.cluster is not None and c.cluster.gpu.fp8_tflops <= 0),
        lambda r, c: f"{c.gpu.key} has no FP8 tensor cores; use --dtype bf16",
    ),
    Rule(
        "fp8_recipe_gpu",
        _recipe_off_gpu,
        lambda r, c: (
            f"the {RECIPE_CHOICES[r['fp8_recipe']]} FP8 recipe needs a "
            f"{' or '.join(recipe_of(r['fp8_recipe']).generations)} GPU ({FP8_SOURCE}); {c.gpu.key} is "
            f"{c.gpu.generation or 'of an unstated generation'}: use --fp8-recipe default (the trainer's own)"
        ),
    ),
    Rule(
        "recompute_modules",
        lambda t, c: (t.recompute == RECOMP["selective"]) & ((t.recompute_modules & lacking_modules(c.model)) > 0),
        _module_needs,
    ),
    Rule(
        "offload_modules",
        lambda t, c: (t.offload_modules & lacking_offload(c.model)) > 0,
        lambda r, c: (
            f"offloading {parse_offload_modules(int(r['offload_modules']) & lacking_offload(c.model))[0]} needs "
            f"a mixture-of-experts model; {c.model.name} has no expert layers: drop it from --offload-modules "
            f"({OFFLOAD_SOURCE})"
        ),
    ),
    Rule(
        "offload_modules_host",
        lambda t, c: (t.offload_modules > 0) & (c.cluster is not None and c.cluster.gpu.host_link_gbps is None),
        lambda r, c: (
            f"activation offload needs the host link bandwidth of the GPU '{c.gpu.key}', which is not stated; "
            f"set host_link_gbps in the cluster file's gpu mapping, or drop --offload-modules"
        ),
    ),
    Rule(
        "recompute_layers",
        lambda t, c: (t.recompute == RECOMP["full"]) & (t.recompute_layers > c.stages.max_rank_layers),
        lambda r, c: (
            f"recompute layers ({r['recompute_layers']}) exceed the layers on one stage "
            f"({int(c.stages.max_rank_layers[r['_i']])})"
        ),
    ),
)


def rule_words(label: str) -> str:
    """A rejection label as a reader takes it: a model rule's words ("microbatches%pp" ->
    "microbatches not a multiple of pp (interleaved 1F1B)"), a trainer's capability line with the
    trainer's name ("deepspeed:pp_schedules" -> "DeepSpeed: pp schedules"), else the label ("memory")."""
    from autopar.spec.trainers import ALL_TRAINERS, get_trainer

    words = {r.name: r.words for r in RULES if r.words}
    if label in words:
        return words[label]
    trainer, _, kind = label.partition(":")
    if kind and trainer in ALL_TRAINERS:
        return f"{get_trainer(trainer).title}: {kind.replace('_', ' ')}"
    return label


def rejection_summary(rejections: dict[str, int], limit: int = 6) -> str:
    """The most common rejection reasons in words with their plan counts, most first; one trainer's
    capability lines that reject the same number of plans shown as one entry ("DeepSpeed: moe, moe
    dispatch, moe dispatcher (74,750)"): equal counts of one trainer's lines are the plans of one
    feature it lacks (every MoE plan breaks each MoE line of a trainer without MoE), which one entry
    per line would count again and again."""
    entries: list[list] = []  # [trainer or None, [kinds or words], count]
    for label, count in rejections.items():
        trainer, _, kind = label.partition(":")
        words = rule_words(label)
        same = next((e for e in entries if kind and e[0] == trainer and e[2] == count), None)
        if same is not None:
            same[1].append(kind.replace("_", " "))
        else:
            entries.append([trainer if kind else None, [words], count])
    return ", ".join(f"{', '.join(names)} ({n:,})" for _, names, n in entries[:limit])


def all_rules(trainer_capabilities: bool = True) -> tuple:
    """The model rules, then every trainer's capability lines (autopar.spec.trainer_rules)."""
    return RULES + trainer_rules() if trainer_capabilities else RULES


@dataclass
class RuleResult:
    masks: dict[str, np.ndarray]
    context: Context
    table: PlanColumns
    trainer_capabilities: bool = True

    @property
    def rules(self) -> tuple:
        return all_rules(self.trainer_capabilities)

    def codes(self) -> np.ndarray:
        """Per row, a bit per broken rule (bit i = the i-th of `rules`); 0 = valid."""
        out = np.zeros(len(self.table), dtype=np.uint64)
        for i, rule in enumerate(self.rules):
            m = self.masks[rule.name]
            if m.any():
                out[m] |= np.uint64(1 << i)
        return out

    @property
    def valid(self) -> np.ndarray:
        return self.codes() == 0

    def labels(self, i: int) -> list[str]:
        """Row i's broken rules by name; a trainer's capability line as '<trainer>:<kind>'."""
        return [rule_label(rule, int(self.table.trainer[i])) for rule in self.rules if self.masks[rule.name][i]]

    def short_reasons(self) -> np.ndarray:
        """Per row, the labels of its broken rules joined by ', ' ('' if valid)."""
        return reason_text(self.codes(), self.table.trainer, self.rules)

    def reasons(self, i: int) -> list[str]:
        """Row i's broken rules, each as a sentence."""
        row = {k: v[i].item() for k, v in self.table.columns.items()}
        row["_i"] = i
        row["_m"] = int(self.table.num_microbatches[i])
        return [rule.explain(row, self.context) for rule in self.rules if self.masks[rule.name][i]]


def rule_label(rule, trainer_code: int) -> str:
    """A rule's short name; a trainer's capability line names the trainer ('deepspeed:cp')."""
    return rule.label(trainer_code) if hasattr(rule, "label") else rule.name


def reason_text(codes: np.ndarray, trainer: np.ndarray, rules: tuple) -> np.ndarray:
    """The ', '-joined labels of rule bitmasks (`RuleResult.codes`), built once per distinct
    (bitmask, trainer) pair."""
    out = np.full(len(codes), "", dtype=object)
    bad = np.flatnonzero(codes != 0)
    if not len(bad):
        return out
    pairs, inverse = np.unique(
        np.stack([codes[bad], trainer[bad].astype(np.uint64)], axis=1), axis=0, return_inverse=True
    )
    texts = np.array(
        [", ".join(rule_label(r, int(t)) for i, r in enumerate(rules) if int(c) >> i & 1) for c, t in pairs],
        dtype=object,
    )
    out[bad] = texts[inverse.reshape(-1)]
    return out


def capability_codes(table: PlanColumns, context: Context) -> np.ndarray:
    """Per row, the bits of the trainer capability lines it breaks, at their places in
    `all_rules()` (after the model rules): with the model rules' `codes()`, a row's full bitmask.
    The search checks each trainer this way on plans it prices once (autopar.calibration.estimate)."""
    out = np.zeros(len(table), dtype=np.uint64)
    for i, rule in enumerate(trainer_rules(), start=len(RULES)):
        m = np.asarray(rule.violated(table, context), dtype=bool)
        if m.any():
            out[np.broadcast_to(m, (len(table),))] |= np.uint64(1 << i)
    return out


def check_rules(
    table: PlanColumns,
    model: ModelSpec,
    *,
    num_gpus: int | None = None,
    cluster: ClusterSpec | None = None,
    seq_len: int | None = None,
    stages: StageProfiles | None = None,
    trainer_capabilities: bool = True,
    recipes: frozenset[str] = frozenset(),
) -> RuleResult:
    """Every rule on every row; `recipes`: the trainers whose recipe the question names (Context)."""
    ctx = Context(
        model=model,
        num_gpus=num_gpus,
        cluster=cluster,
        seq_len=seq_len or model.seq_len,
        stages=stages if stages is not None else stage_profiles(table, model),
        recipes=recipes,
    )
    masks = {}
    for rule in all_rules(trainer_capabilities):
        m = np.asarray(rule.violated(table, ctx), dtype=bool)
        masks[rule.name] = np.broadcast_to(m, (len(table),))
    return RuleResult(masks, ctx, table, trainer_capabilities)


def plan_problems(
    plan,
    model: ModelSpec,
    *,
    num_gpus: int | None = None,
    cluster: ClusterSpec | None = None,
    seq_len: int | None = None,
    trainer_capabilities: bool = True,
) -> list[str]:
    """Every rule the plan (a ParallelPlan, autopar.spec.plan) breaks, as sentences, checked on a
    table of one row; `trainer_capabilities=False` leaves out its trainer's capability lines (a
    published run ran on its own framework)."""
    result = check_rules(
        PlanColumns.of_plans([plan], plan_fields(type(plan))),
        model,
        num_gpus=num_gpus,
        cluster=cluster,
        seq_len=seq_len,
        trainer_capabilities=trainer_capabilities,
    )
    return result.reasons(0)
