"""A published run's parallel plan: the layout, batch, recompute, ZeRO stage, sequence parallelism,
TP overlap and MoE dispatch its row states, each field it leaves empty filled with a recorded
assumption (the words a source uses read as autopar's plan; autopar.calibration.run_cases builds the case)."""

from __future__ import annotations

import re

from autopar.calibration.row_cells import row_offloaded, row_recompute_modules
from autopar.calibration.run_rows import FAMILY_TRAINER, PublishedRow
from autopar.calibration.sources import declared, nvidia_recipes
from autopar.spec.layout import balanced_layout, parse_layout
from autopar.spec.plan import ParallelPlan


def run_plan(r: PublishedRow, model, cluster) -> ParallelPlan:
    """The row's plan on its own GPUs, with the trainer of its family; what it assumes goes to `notes`."""
    tp, pp, cp, ep, vpp, dp = _degrees(r, model, cluster)
    vpp = _interleaving(r, pp, vpp)
    if declared(r.source).group == "torchtitan":
        mbs, gbs = _torchtitan_batches(r, dp, pp, vpp)
    else:
        mbs, gbs = r.integer("micro_batch_size"), r.integer("global_batch_size")
    if mbs is None:
        mbs = 1
        r.notes.append("micro-batch not stated: assumed 1")
    if not gbs:
        if r.source == "fms-fsdp":
            gbs = mbs * dp
            r.notes.append("global batch not printed: per-GPU batch x GPUs (no accumulation)")
        else:
            raise ValueError("global batch not stated")
    local = gbs / dp
    if local != int(local) or int(local) % mbs:
        mbs = _divisor_near(int(round(local)), mbs)
        gbs = mbs * dp * max(1, round(local / mbs))
        r.notes.append(
            f"microbatches do not divide the local batch (Composer accumulates uneven chunks): "
            f"priced as mbs {mbs}, gbs {gbs}"
        )
    recompute, rl, modules = _recompute(r, model, pp, vpp)
    zero = _zero(r)
    dtype = "fp8" if re.search(r"fp8|float8", r.text("precision"), re.I) else "bf16"
    sp = _sequence_parallel(r, tp, model)
    overlap = _tp_overlap(r, tp, sp)
    etp, dispatcher, ep_overlap, dispatch = _moe(r, model)
    schedule = _schedule(r, pp)
    return ParallelPlan(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        zero_stage=zero,
        sequence_parallel=sp and tp > 1,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        recompute=recompute,
        recompute_layers=rl,
        recompute_modules=modules,
        dtype=dtype,
        fp8_recipe=_fp8_recipe(r) if dtype == "fp8" else "default",
        fp8_param_gather=_fp8_param_gather(r) if dtype == "fp8" and zero >= 1 else "default",
        tp_comm_overlap=overlap and tp > 1,
        compile=_compiled(r),
        layout=_layout(r, model, pp, vpp),
        trainer=FAMILY_TRAINER[r.family],
        moe_dispatcher=dispatcher,
        moe_dispatch=dispatch,
        ep_comm_overlap=ep_overlap and ep > 1,
        pp_schedule=schedule,  # None: the default for vpp (ParallelPlan.__post_init__)
        optimizer_offload=_optimizer_offload(r),
        offload_modules=_offload_modules(r),
    )


def _degrees(r: PublishedRow, model, cluster) -> tuple[int, int, int, int, int, int]:
    """(tp, pp, cp, ep, vpp, dp) as the row states them, with what it leaves out assumed and noted."""
    G = r.integer("num_gpus")
    tp, pp = r.integer("tp"), r.integer("pp")
    if tp is None or pp is None:
        dpd = r.num("dp_derived")
        if dpd is None or not G:
            raise ValueError("tp/pp not stated and model-parallel size unknown")
        mp = round(G / dpd)
        tp = min(mp, cluster.gpus_per_node)
        pp = mp // tp
        r.notes.append(f"only model-parallel size {mp} stated: assumed tp={tp}, pp={pp}")
    cp = r.integer("cp") or 1
    vpp = r.integer("vpp") or 1
    ep = r.integer("ep") or 1
    assert G is not None  # row_problem (autopar.calibration.run_checks) rejects a row without num_gpus
    dp = G // (tp * pp * cp)
    if dp * tp * pp * cp != G:
        raise ValueError(f"tp*pp*cp = {tp * pp * cp} does not divide {G} GPUs")
    if model.moe is not None and r.integer("ep") is None and r.source == "automodel" and "DeepEP" in r.text("notes"):
        ep = dp
        r.notes.append(f"EP not stated, DeepEP named: experts over the FSDP group (ep {ep}, AutoModel's expert mesh)")
    if r.source == "llama3-paper" and pp > 1 and vpp == 1:
        vpp = 8  # 126 layers + embedding + loss = 128 units: one per virtual stage of pp16 x vpp8
        r.notes.append(
            "interleaving factor not stated: assumed vpp 8 (one layer per virtual stage; first and last "
            "stage one layer less, as the paper says)"
        )
    return tp, pp, cp, ep, vpp, dp


def _interleaving(r: PublishedRow, pp: int, vpp: int) -> int:
    """A torchtitan row naming the interleaved 1F1B schedule without its stages per rank: two
    (the fewest that interleave), noted."""
    if pp > 1 and vpp == 1 and re.search(r"Interleaved 1F1B", r.text("notes")):
        r.notes.append("interleaved 1F1B with its stages per rank not stated: assumed 2")
        return 2
    return vpp


def _torchtitan_batches(r: PublishedRow, dp: int, pp: int, vpp: int) -> tuple[int | None, int | None]:
    """(micro-batch, global batch) of a torchtitan benchmark row, from its local batch (per data-
    parallel rank: the micro_batch_size cell, else 'local batch N' in its notes) where it leaves them
    out. torchtitan then had no gradient accumulation: the global batch is the local batch x the
    data-parallel degree. With pipeline parallelism the local batch is split into as many microbatches
    as the pipeline has stages, unless set (torchtitan 2024, parallelisms/pipelining_utils.py
    `build_pipeline_schedule`: n_microbatches defaults to pipeline_parallel_degree x the stages per
    rank; its per-microbatch size became a setting, default 1, in 2025: config `pipeline_parallel_
    microbatch_size`)."""
    mbs, gbs = r.integer("micro_batch_size"), r.integer("global_batch_size")
    m = re.search(r"local batch (\d+)", r.text("notes"))
    local = int(m.group(1)) if m else (mbs if pp == 1 else None)
    if local is None and gbs:
        local = gbs // dp
    if not gbs and local:
        gbs = local * dp
        r.notes.append(f"global batch not stated: local batch {local} x {dp} data-parallel ranks (no accumulation)")
    if pp > 1 and mbs is None and local:
        stages = pp * vpp
        if local % stages == 0:
            mbs = local // stages
            r.notes.append(f"pipeline microbatches not stated: torchtitan's default, one per stage ({stages} of {mbs})")
    return mbs, gbs


def _fp8_recipe(r: PublishedRow) -> str:
    """The FP8 recipe a row states: MXFP8, block scaling (1x128 / 128x128, DeepSeek-V3's), current
    scaling ("FP8-CS" in Megatron-Bridge's tables: Megatron's tensorwise recipe); torchao
    Float8 linears of 2024 scaled per tensor (torchao's only float8 recipe before rowwise scaling,
    torchao 0.7, December 2024); llm-foundry's amp_fp8 runs Transformer Engine's delayed scaling;
    otherwise its trainer's default (delayed scaling for Megatron-Core and NeMo)."""
    text = r.text("precision")
    if re.search(r"mxfp8", text, re.I):
        return "mxfp8"
    if re.search(r"blockwise|block scaling|1x128", text, re.I):
        return "blockwise"
    if re.search(r"FP8-CS|current scaling", text, re.I):  # Megatron-Bridge's tables: FP8 current scaling
        return "tensorwise"
    if r.source == "llm-foundry":  # Composer's amp_fp8: Transformer Engine's DelayedScaling
        return "delayed"
    return "tensorwise" if re.search(r"torchao", text, re.I) else "default"


def _fp8_param_gather(r: PublishedRow) -> str:
    """FP8 parameters where the row's program keeps them: NeMo 2's and Megatron-Bridge's FP8 recipes
    (nemo/collections/llm/recipes/precision/mixed_precision.py, megatron/bridge/training/
    mixed_precision.py: fp8_param_gather=True) and a row stating FP8 primary weights; otherwise its
    trainer's default (off: Megatron-LM's --fp8-param-gather is opt-in)."""
    stated = " ".join(r.text(k) for k in ("precision", "framework", "notes"))
    recipe_gathers = declared(r.source).stack == "nemo-bridge" and _fp8_recipe(r) != "blockwise"
    stated_on = re.search(r"fp8 primary weights|float8 all-gather", stated, re.I)
    return "on" if recipe_gathers or stated_on else "default"


def _offload_modules(r: PublishedRow) -> tuple[str, ...] | None:
    """The activations a row offloads to the host (Megatron-Core fine-grained activation
    offloading, named after "offloading" in its recompute cell)."""
    names = row_offloaded(r.text("recompute"))
    if names:
        r.notes.append(f"activations offloaded: {', '.join(names)} (Megatron --offload-modules)")
    return names or None


def _optimizer_offload(r: PublishedRow) -> float:
    """The share of the optimizer shard a row states it offloads to the host: the whole of it
    where the row says "optimizer(-state) CPU offload" without a fraction (Megatron
    --optimizer-cpu-offload with --optimizer-offload-fraction 1)."""
    text = f"{r.text('framework')} {r.text('zero_or_dist_opt')}"
    if re.search(r"optimizer-state CPU offload|optimizer CPU offload", text, re.I):
        r.notes.append("optimizer states offloaded to the host (the row): priced as the whole shard")
        return 1.0
    return 0.0


def _moe(r: PublishedRow, model) -> tuple[int | None, str, bool, str]:
    """(expert TP, dispatcher, EP overlap, dispatch mode) of a MoE row (nothing for a dense one)."""
    if model.moe is None:
        return None, "alltoall", False, "dropless"
    r.notes.append("expert-TP 1 (ModelZoo/Bridge MoE recipes state ETP 1)")
    dispatcher, ep_overlap = _moe_comm(r)
    if re.search(r"tokendrop|token-drop", r.text("model") + " " + r.text("notes"), re.I):
        # padding experts to capacity is refused by the flex (DeepEP) dispatcher
        # (megatron/core/transformer/transformer_config.py): token-drop runs use the all-to-all one
        r.notes.append("token drop: capacity dispatch at capacity factor 1 with the all-to-all dispatcher")
        return 1, "alltoall", ep_overlap, "capacity"
    return 1, dispatcher, ep_overlap, "dropless"


def _schedule(r: PublishedRow, pp) -> str | None:
    """The pipeline schedule a row states, where it is not Megatron's default for its vpp."""
    if re.search(r"DualPipe", r.text("framework")) and pp > 1:
        r.notes.append(
            "DualPipe priced as zero-bubble (ZB-H1): its bubble (PP/2-1)(F&B+B-3W) is about ZB-H1's "
            "(DeepSeek-V3 report Table 2)"
        )
        return "zero-bubble"
    return None


def _moe_comm(r: PublishedRow) -> tuple[str, bool]:
    """The dispatcher and EP overlap a MoE row states ('Dispatcher DeepEP', 'HybridEP dispatcher',
    'A2A_OVERLAP=1', '+1f1b overlap', '1F1B A2A overlap ON', 'DualPipe'); Megatron-Bridge recipes
    apply the flex dispatcher backend (megatron/bridge/recipes/*: apply_flex_dispatcher_backend,
    DeepEP / HybridEP)."""
    words = " ".join(r.text(k) for k in ("notes", "interconnect", "framework"))
    if re.search(r"DeepEP|HybridEP", words):
        dispatcher = "deepep"
    elif r.source == "deepseek-v3-report":
        dispatcher = "deepep"
        r.notes.append(
            "dispatcher: DeepSeek's own deduplicating cross-node all-to-all kernels (report sec. 3.2.2, "
            "released as DeepEP)"
        )
    elif not r.source.startswith("bridge-") or re.search(
        r"Dispatcher A2A|AlltoAll dispatcher|all-to-all dispatcher", words, re.I
    ):
        dispatcher = "alltoall"
    else:
        dispatcher = "deepep"
        r.notes.append("dispatcher not stated: the Megatron-Bridge recipe's flex backend (DeepEP/HybridEP)")
    on = re.search(r"A2A_OVERLAP=1|\+1f1b overlap|overlap ON|DualPipe", words, re.I) is not None
    return dispatcher, on and re.search(r"overlap OFF|A2A_OVERLAP=0", words, re.I) is None


def _divisor_near(n: int, want: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), -d))


#: Megatron-Bridge releases whose performance-summary rows state no recompute, and the models whose
#: library recipe (on which the release's performance scripts build each workload) recomputes every
#: layer in full: megatron-bridge 0.2.0rc6 (2025-10-06, the last 0.2 build on PyPI before NeMo
#: 25.11) and 0.3.0 (2026-02-26, NeMo 26.02) `recipes/qwen/qwen3_moe.py`
#: `qwen3_30b_a3b_pretrain_config` set `enable_recompute=True` (recompute_granularity "full",
#: method "uniform", 1 layer per chunk). The 25.09 branch (0.1.0rc4) has no Qwen3 recipe; the
#: Qwen3-235B and Llama recipes of both, and 0.3.0's GPT-OSS recipe, enable none.
BRIDGE_RECIPE_FULL_RECOMPUTE = (frozenset({"bridge-25.11", "bridge-26.02"}), re.compile(r"qwen3.?30b", re.I))


def _recompute(r: PublishedRow, model, pp, vpp) -> tuple[str, int | None, tuple[str, ...] | None]:
    """(recompute, recompute layers, recompute modules) from the source's words: full; selective =
    the attention core (Megatron's default modules, torchtitan 'op' SAC); torchtitan 'selective
    (layer)' checkpoints every other block; fms-fsdp's selective fraction is not printed (half
    assumed); Megatron's --recompute-modules listed: selective with those modules (core_attn only
    where the row lists it; autopar.calibration.memory_facts row_recompute_modules)."""
    t = r.text("recompute").lower()
    per_rank = model.num_layers // pp
    if t.startswith("full"):
        return "full", None, None
    if "selective (layer)" in t:
        r.notes.append("torchtitan selective layer AC: every other block fully recomputed (ac_freq 2)")
        return "full", _multiple(per_rank // 2, vpp), None
    if t == "selective" and r.source == "fms-fsdp":
        r.notes.append("fms-fsdp selective AC fraction not printed: assumed half the blocks")
        return "full", _multiple(per_rank // 2, vpp), None
    modules_only = re.match(r"^(core_attn|moe_act|layernorm|mlp|up_proj|mla_up_proj|moe)\b", t)
    if t.startswith("selective:") or modules_only:
        modules = row_recompute_modules(t)
        if modules:
            r.notes.append(f"recompute modules: {', '.join(modules)} (Megatron --recompute-modules)")
            return "selective", None, modules
        r.notes.append(f"recompute modules ({t[:40]}) name none autopar knows: priced as no recompute")
        return "none", None, None
    if t.startswith("selective"):
        return "selective", None, None
    if t.startswith("none"):
        return "none", None, None
    if 10 <= r.row_id <= 19:
        r.notes.append("recompute not stated: assumed full (Narayanan et al. 2021 used activation recomputation)")
        return "full", None, None
    releases, models = BRIDGE_RECIPE_FULL_RECOMPUTE
    if r.source in releases and models.search(r.text("model")):
        r.notes.append("recompute not stated: full, every layer (the release's Megatron-Bridge library recipe)")
        return "full", None, None
    r.notes.append("recompute not stated: assumed none")
    return "none", None, None


def _multiple(n: int, vpp: int) -> int:
    return max(vpp, n - n % vpp)


def _zero(r: PublishedRow) -> int:
    z = (r.text("zero_or_dist_opt") + " " + r.text("fsdp")).lower()
    if "shard_grad_op" in z or "zero-2" in z or "not resharded" in z:
        return 2
    if "hybrid" in z:
        r.notes.append("HSDP (shard in a node, replicate across) priced as FSDP over every data-parallel rank")
        return 3
    if "full_shard" in z or "zero-3" in z or "fully sharded" in z or "megatron fsdp" in z or "fsdp" in z.split():
        return 3
    if "zero-1" in z or "distributed optimizer" in z:
        return 1
    if "zero-0" in z:
        return 0
    if r.family == "fsdp":
        return 3
    if r.source in ("megatron-readme-2021", "korthikanti-2022"):
        r.notes.append("no distributed optimizer (pre-2023 Megatron)")
        return 0
    if r.source == "megatron-readme-h100":
        r.notes.append("distributed optimizer (the README's --overlap-param-gather needs it)")
        return 1
    r.notes.append("distributed optimizer assumed")
    return 1


#: the first publication of Megatron's sequence parallelism (Korthikanti et al., arXiv 2205.05198):
#: a run published before it could not use it
SEQUENCE_PARALLEL_SINCE = "2022-05-10"


def _sequence_parallel(r: PublishedRow, tp, model) -> bool:
    t = r.text("sequence_parallel").lower()
    if t in ("on", "off"):
        return t == "on"
    if t.startswith("yes"):
        return True
    published = declared(r.source).published
    if tp > 1 and published and published < SEQUENCE_PARALLEL_SINCE:
        r.notes.append("SP off (published before sequence parallelism: Korthikanti et al. 2022)")
        return model.moe is not None
    if tp > 1:
        r.notes.append(
            "SP not stated: assumed on"
            + (" (nanotron's default reduce-scatter TP mode)" if r.family == "nanotron" else "")
        )
    return tp > 1 or model.moe is not None


def _tp_overlap(r: PublishedRow, tp, sp) -> bool:
    if tp == 1:
        return False
    if "async TP" in r.text("notes") or "async TP" in r.text("precision"):
        r.notes.append("async TP (torchtitan) as TP comm overlap")
        return True
    if "--tp-comm-overlap" in r.text("notes") or r.source == "megatron-readme-h100":
        return sp
    if nvidia_recipes(r.source):
        r.notes.append("TP comm overlap on (assumed: NeMo/Megatron-Bridge H100 recipes enable it)")
        return sp
    return False


def _compiled(r: PublishedRow) -> bool:
    """torch.compile as the row states it: fms-fsdp's table ('compile Y', its framework 'FSDP1 +
    torch.compile'), torchtitan's 405B config of the 2024 table (notes: 'compile=true'), its
    benchmark tables ('+ compile', '--training.compile'); the other
    rows ran eager (torchtitan's 8B/70B configs 'compile=false', and torch.compile is off by
    default in every stack autopar prices)."""
    text = r.text("framework") + " " + r.text("notes")
    if re.search(r"compile=true|compile Y\b|\+ (torch\.)?compile\b|--training\.compile", text):
        r.notes.append("torch.compile on (as the row states)")
        return True
    return False


def _layout(r: PublishedRow, model, pp, vpp):
    """Layouts the sources state: BLOOM's tied embedding gets its own slot at both ends; the
    DeepSeek-V3 GB200 guide's 'Et|(tt|)*30L'."""
    if pp == 1:
        return None
    if r.source == "bloom":
        r.notes.append("--pp-partition-method type:transformer|embedding: embedding and head counted as layers")
        return balanced_layout(model.num_layers, pp * vpp, embedding_as_layer=True, loss_as_layer=True)
    m = re.search(r"layout '([^']+)'", r.text("notes"))
    if m and r.source == "deepseek-v3-gb200":
        stages = [
            x.count("t")
            for x in re.sub(r"\((.*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), m.group(1)).split("|")
        ]
        return parse_layout(",".join(str(x) for x in stages)) if sum(stages) == model.num_layers else None
    return None
