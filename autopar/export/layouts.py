"""Pipeline layouts in the trainers' own encodings, and back.

Megatron-Core (Megatron-LM, NeMo 2, Megatron-Bridge) has three ways to place layers, tried in
this order (the first that reproduces the layout exactly wins):
1. even: every virtual stage holds num_layers / (pp*vpp) layers (`--num-layers-per-virtual-pipeline-stage`);
2. first/last: `--decoder-first-pipeline-num-layers F` / `--decoder-last-pipeline-num-layers L`
   (TransformerConfig `num_layers_in_first/last_pipeline_stage`), the rest split evenly over the
   middle ranks; with vpp > 1 every rank's layers are split evenly over its vpp chunks
   (megatron/core/transformer/transformer_block.py `get_num_layers_to_build`);
3. `--pipeline-model-parallel-layout`: one string with a stage per virtual stage, `|` between
   stages, E embedding, L loss, t layer, `x*n` and `(...)*n` repetition, commas cosmetic
   (megatron/core/transformer/pipeline_parallel_layer_layout.py `parse_str_to_list`).

torchtitan takes `module_fqns_per_model_part`: the module names of every virtual stage, which
reproduces any layout; stage i of pp ranks runs on rank i % pp (its "loop" style).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MegatronLayout:
    kind: str  # "none" (pp = 1) | "even" | "first_last" | "layout"
    layers_per_virtual_stage: int | None = None  # even with vpp > 1
    virtual_stages_per_rank: int | None = None  # first/last with vpp > 1
    first: int | None = None
    last: int | None = None
    layout: str | None = None


def _rank_chunks(stages: tuple[int, ...], pp: int, vpp: int) -> list[list[int]]:
    """Layers of each (rank, chunk): virtual stage c*pp + r runs on rank r."""
    return [[stages[c * pp + r] for c in range(vpp)] for r in range(pp)]


def megatron_layout(stages: tuple[int, ...], pp: int, vpp: int) -> MegatronLayout:
    if pp == 1:
        return MegatronLayout("none")
    if len(set(stages)) == 1:
        return MegatronLayout("even", layers_per_virtual_stage=stages[0] if vpp > 1 else None)
    chunks = _rank_chunks(stages, pp, vpp)
    uniform = all(len(set(c)) == 1 for c in chunks)
    if uniform:
        a, b = chunks[0][0], chunks[-1][0]
        middle = {c[0] for c in chunks[1:-1]}
        if len(middle) <= 1:
            m = middle.pop() if middle else None
            first = None if (m is not None and a == m) else a * vpp
            last = None if (m is not None and b == m) else b * vpp
            if pp == 2:  # rank 1 is the "middle": give the first rank only
                first, last = a * vpp, None
            if (first is None or first > 0) and (last is None or last > 0) and (m is None or m > 0):
                return MegatronLayout(
                    "first_last", virtual_stages_per_rank=vpp if vpp > 1 else None, first=first, last=last
                )
    return MegatronLayout("layout", layout=layout_string(stages))


def _stage_text(i: int, n: int, k: int) -> str:
    body = "t" if k == 1 else (f"t*{k}" if k > 1 else "")
    return ("E" if i == 0 else "") + body + ("L" if i == n - 1 else "")


def layout_string(stages: tuple[int, ...]) -> str:
    """Megatron's `--pipeline-model-parallel-layout` string for layers per virtual stage; runs of
    three or more identical stages are written `(t*k|)*n`."""
    n = len(stages)
    texts = [_stage_text(i, n, k) for i, k in enumerate(stages)]
    out: list[str] = []
    i = 0
    while i < n:
        j = i
        while j + 1 < n - 1 and texts[j + 1] == texts[i]:  # never fold the last stage into a run
            j += 1
        run = j - i + 1
        if i < n - 1 and run >= 3:
            out.append(f"({texts[i]}|)*{run}" + ("," if j + 1 < n else ""))
            i = j + 1
        else:
            out.append(texts[i] + ("|" if i < n - 1 else ""))
            i += 1
    return "".join(out)


def parse_layout_string(text: str) -> list[str]:
    """Megatron's own expansion (pipeline_parallel_layer_layout.py parse_str_to_list): the stages
    as strings of layer characters."""
    s = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), s)
    stages = s.split("|")
    bad = set("".join(stages)) - set("ELtm")
    if bad:
        raise ValueError(f"layout string {text!r} has unknown layer characters {sorted(bad)}")
    return stages


def stages_from_layout_string(text: str) -> tuple[int, ...]:
    return tuple(st.count("t") for st in parse_layout_string(text))


def stages_from_megatron(
    num_layers: int,
    pp: int,
    *,
    vpp: int = 1,
    first: int | None = None,
    last: int | None = None,
    layout: str | None = None,
) -> tuple[int, ...]:
    """Layers per virtual stage the way Megatron-Core builds them from its flags."""
    if layout is not None:
        return stages_from_layout_string(layout)
    if first is None and last is None:
        per = num_layers // (pp * vpp)
        return (per,) * (pp * vpp)
    rest, left = num_layers, pp
    if first is not None:
        rest, left = rest - first, left - 1
    if last is not None:
        rest, left = rest - last, left - 1
    middle = rest // left if left else 0
    per_rank = [middle] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return tuple(per_rank[i % pp] // vpp for i in range(pp * vpp))


def torchtitan_fqns(stages: tuple[int, ...], output: str) -> list[list[str]]:
    """`module_fqns_per_model_part` for layers per virtual stage. `output` is the LM head's module
    name: "output" in torchtitan <= 0.2.2, "lm_head" from 0.3."""
    parts, start = [], 0
    for i, k in enumerate(stages):
        part = ["tok_embeddings"] if i == 0 else []
        part += [f"layers.{j}" for j in range(start, start + k)]
        start += k
        if i == len(stages) - 1:
            part += ["norm", output]
        parts.append(part)
    return parts


def stages_from_fqns(parts: list[list[str]]) -> tuple[int, ...]:
    return tuple(sum(1 for m in part if m.startswith("layers.")) for part in parts)
