"""A published run's parallel plan: the layout, batch, recompute, ZeRO stage, sequence parallelism,
TP overlap and MoE dispatch its row states, each field it leaves empty filled with a recorded
assumption (the words a source uses read as autopar's plan; autopar.cost.run_cases builds the case)."""

from __future__ import annotations

import re

from autopar.cost.run_rows import FAMILY_TRAINER, integer, num, text
from autopar.spec.layout import balanced_layout, parse_layout
from autopar.spec.plan import ParallelPlan


def run_plan(row, rid, src, fam, model, cluster, s, notes) -> ParallelPlan:
    """The row's plan on its own GPUs, with the trainer of its family; what it assumes goes to `notes`."""
    G = integer(row, "num_gpus")
    tp, pp = integer(row, "tp"), integer(row, "pp")
    if tp is None or pp is None:
        dpd = num(row, "dp_derived")
        if dpd is None or not G:
            raise ValueError("tp/pp not stated and model-parallel size unknown")
        mp = round(G / dpd)
        tp = min(mp, cluster.gpus_per_node)
        pp = mp // tp
        notes.append(f"only model-parallel size {mp} stated: assumed tp={tp}, pp={pp}")
    cp = integer(row, "cp") or 1
    vpp = integer(row, "vpp") or 1
    ep = integer(row, "ep") or 1
    assert G is not None  # row_problem (autopar.cost.run_checks) rejects a row without num_gpus
    dp = G // (tp * pp * cp)
    if dp * tp * pp * cp != G:
        raise ValueError(f"tp*pp*cp = {tp * pp * cp} does not divide {G} GPUs")
    if src == "llama3-paper" and pp > 1 and vpp == 1:
        vpp = 8  # 126 layers + embedding + loss = 128 units: one per virtual stage of pp16 x vpp8
        notes.append(
            "interleaving factor not stated: assumed vpp 8 (one layer per virtual stage; first and last "
            "stage one layer less, as the paper says)"
        )
    mbs = integer(row, "micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch not stated: assumed 1")
    gbs = integer(row, "global_batch_size")
    if not gbs:
        if src == "fms-fsdp":
            gbs = mbs * dp
            notes.append("global batch not printed: per-GPU batch x GPUs (no accumulation)")
        else:
            raise ValueError("global batch not stated")
    local = gbs / dp
    if local != int(local) or int(local) % mbs:
        mbs = _divisor_near(int(round(local)), mbs)
        gbs = mbs * dp * max(1, round(local / mbs))
        notes.append(
            f"microbatches do not divide the local batch (Composer accumulates uneven chunks): "
            f"priced as mbs {mbs}, gbs {gbs}"
        )
    recompute, rl = _recompute(row, rid, src, fam, model, pp, vpp, notes)
    zero = _zero(row, src, fam, notes)
    dtype = "fp8" if re.search(r"fp8|float8", text(row, "precision"), re.I) else "bf16"
    sp = _sequence_parallel(row, fam, tp, model, notes)
    overlap = _tp_overlap(row, rid, src, tp, sp, notes)
    etp, dispatcher, ep_overlap, dispatch = _moe(row, src, model, notes)
    schedule = _schedule(row, pp, notes)
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
        dtype=dtype,
        tp_comm_overlap=overlap and tp > 1,
        layout=_layout(row, src, model, pp, vpp, notes),
        trainer=FAMILY_TRAINER[fam],
        moe_dispatcher=dispatcher,
        moe_dispatch=dispatch,
        ep_comm_overlap=ep_overlap and ep > 1,
        pp_schedule=schedule,  # None: the default for vpp (ParallelPlan.__post_init__)
    )


def _moe(row, src, model, notes) -> tuple[int | None, str, bool, str]:
    """(expert TP, dispatcher, EP overlap, dispatch mode) of a MoE row (nothing for a dense one)."""
    if model.moe is None:
        return None, "alltoall", False, "dropless"
    notes.append("expert-TP 1 (ModelZoo/Bridge MoE recipes state ETP 1)")
    dispatcher, ep_overlap = _moe_comm(row, src, notes)
    if re.search(r"tokendrop|token-drop", text(row, "model") + " " + text(row, "notes"), re.I):
        # padding experts to capacity is refused by the flex (DeepEP) dispatcher
        # (megatron/core/transformer/transformer_config.py): token-drop runs use the all-to-all one
        notes.append("token drop: capacity dispatch at capacity factor 1 with the all-to-all dispatcher")
        return 1, "alltoall", ep_overlap, "capacity"
    return 1, dispatcher, ep_overlap, "dropless"


def _schedule(row, pp, notes) -> str | None:
    """The pipeline schedule a row states, where it is not Megatron's default for its vpp."""
    if re.search(r"DualPipe", text(row, "framework")) and pp > 1:
        notes.append(
            "DualPipe priced as zero-bubble (ZB-H1): its bubble (PP/2-1)(F&B+B-3W) is about ZB-H1's "
            "(DeepSeek-V3 report Table 2)"
        )
        return "zero-bubble"
    return None


def _moe_comm(row, src, notes) -> tuple[str, bool]:
    """The dispatcher and EP overlap a MoE row states ('Dispatcher DeepEP', 'HybridEP dispatcher',
    'A2A_OVERLAP=1', '+1f1b overlap', '1F1B A2A overlap ON', 'DualPipe'); Megatron-Bridge recipes
    apply the flex dispatcher backend (megatron/bridge/recipes/*: apply_flex_dispatcher_backend,
    DeepEP / HybridEP)."""
    words = " ".join(text(row, k) for k in ("notes", "interconnect", "framework"))
    if re.search(r"DeepEP|HybridEP", words):
        dispatcher = "deepep"
    elif src == "deepseek-v3-report":
        dispatcher = "deepep"
        notes.append(
            "dispatcher: DeepSeek's own deduplicating cross-node all-to-all kernels (report sec. 3.2.2, "
            "released as DeepEP)"
        )
    elif src != "bridge-25.09" or re.search(r"Dispatcher A2A|AlltoAll dispatcher|all-to-all dispatcher", words, re.I):
        dispatcher = "alltoall"
    else:
        dispatcher = "deepep"
        notes.append("dispatcher not stated: the Megatron-Bridge recipe's flex backend (DeepEP/HybridEP)")
    on = re.search(r"A2A_OVERLAP=1|\+1f1b overlap|overlap ON|DualPipe", words, re.I) is not None
    return dispatcher, on and re.search(r"overlap OFF|A2A_OVERLAP=0", words, re.I) is None


def _divisor_near(n: int, want: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - want), -d))


def _recompute(row, rid, src, fam, model, pp, vpp, notes) -> tuple[str, int | None]:
    """The source's words as autopar's recompute: full; selective = the attention core (Megatron,
    torchtitan 'op' SAC); torchtitan 'selective (layer)' checkpoints every other block; fms-fsdp's
    selective fraction is not printed (half assumed); Megatron's --recompute-modules of elementwise
    ops (norm, act) recompute no GEMM: priced as none."""
    t = text(row, "recompute").lower()
    per_rank = model.num_layers // pp
    if t.startswith("full"):
        return "full", None
    if "selective (layer)" in t:
        notes.append("torchtitan selective layer AC: every other block fully recomputed (ac_freq 2)")
        return "full", _multiple(per_rank // 2, vpp)
    if t == "selective" and src == "fms-fsdp":
        notes.append("fms-fsdp selective AC fraction not printed: assumed half the blocks")
        return "full", _multiple(per_rank // 2, vpp)
    modules_only = re.match(r"^(core_attn|moe_act|layernorm|mlp|up_proj|mla_up_proj|moe)\b", t)
    if t.startswith("selective:") or modules_only:
        modules = t.split(":", 1)[1] if t.startswith("selective:") else t
        if "core_attn" in modules:
            return "selective", None
        notes.append(
            f"recompute modules ({modules.strip()[:40]}) recompute elementwise ops or small GEMMs only: priced as none"
        )
        return "none", None
    if t.startswith("selective"):
        return "selective", None
    if t.startswith("none"):
        return "none", None
    if 10 <= rid <= 19:
        notes.append("recompute not stated: assumed full (Narayanan et al. 2021 used activation recomputation)")
        return "full", None
    notes.append("recompute not stated: assumed none")
    return "none", None


def _multiple(n: int, vpp: int) -> int:
    return max(vpp, n - n % vpp)


def _zero(row, src, fam, notes) -> int:
    z = (text(row, "zero_or_dist_opt") + " " + text(row, "fsdp")).lower()
    if "shard_grad_op" in z or "zero-2" in z or "not resharded" in z:
        return 2
    if "hybrid" in z:
        notes.append("HSDP (shard in a node, replicate across) priced as FSDP over every data-parallel rank")
        return 3
    if "full_shard" in z or "zero-3" in z or "fully sharded" in z or "megatron fsdp" in z or "fsdp" in z.split():
        return 3
    if "zero-1" in z or "distributed optimizer" in z:
        return 1
    if "zero-0" in z:
        return 0
    if fam == "fsdp":
        return 3
    if src in ("megatron-readme-2021", "korthikanti-2022"):
        notes.append("no distributed optimizer (pre-2023 Megatron)")
        return 0
    if src == "megatron-readme-h100":
        notes.append("distributed optimizer (the README's --overlap-param-gather needs it)")
        return 1
    notes.append("distributed optimizer assumed")
    return 1


def _sequence_parallel(row, fam, tp, model, notes) -> bool:
    t = text(row, "sequence_parallel").lower()
    if t in ("on", "off"):
        return t == "on"
    if t.startswith("yes"):
        return True
    if tp > 1:
        notes.append(
            "SP not stated: assumed on" + (" (nanotron's default reduce-scatter TP mode)" if fam == "nanotron" else "")
        )
    return tp > 1 or model.moe is not None


def _tp_overlap(row, rid, src, tp, sp, notes) -> bool:
    if tp == 1:
        return False
    if "async TP" in text(row, "notes") or "async TP" in text(row, "precision"):
        notes.append("async TP (torchtitan) as TP comm overlap")
        return True
    if "--tp-comm-overlap" in text(row, "notes") or src == "megatron-readme-h100":
        return sp
    if src in ("nemo-24.07", "nemo-long-sequence", "bridge-25.09"):
        notes.append("TP comm overlap on (assumed: NeMo/Megatron-Bridge H100 recipes enable it)")
        return sp
    return False


def _layout(row, src, model, pp, vpp, notes):
    """Layouts the sources state: BLOOM's tied embedding gets its own slot at both ends; the
    DeepSeek-V3 GB200 guide's 'Et|(tt|)*30L'."""
    if pp == 1:
        return None
    if src == "bloom":
        notes.append("--pp-partition-method type:transformer|embedding: embedding and head counted as layers")
        return balanced_layout(model.num_layers, pp * vpp, embedding_as_layer=True, loss_as_layer=True)
    m = re.search(r"layout '([^']+)'", text(row, "notes"))
    if m and src == "deepseek-v3-gb200":
        stages = [
            x.count("t")
            for x in re.sub(r"\((.*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), m.group(1)).split("|")
        ]
        return parse_layout(",".join(str(x) for x in stages)) if sum(stages) == model.num_layers else None
    return None
