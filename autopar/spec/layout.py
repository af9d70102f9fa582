"""Pipeline layouts: how many transformer layers each (virtual) pipeline stage holds.

Virtual stage i lives on pipeline rank i % pp (Megatron's interleaved placement). The embedding is
on virtual stage 0 (rank 0), the final norm, LM head and loss on the last virtual stage (rank pp-1).
A layout may count the embedding and/or the loss as one layer each when balancing, as Megatron-Bridge
recipes do (`account_for_embedding_in_pipeline_split`, `account_for_loss_in_pipeline_split`): that
is how Llama 3.1 405B's 126 layers + 2 split into 64 virtual stages of 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import InputError, quoted


@dataclass(frozen=True)
class PipelineLayout:
    """Transformer layers per virtual stage, in virtual-stage order (length pp * vpp)."""

    stages: tuple[int, ...]
    rule: str = "explicit"  # how it was made: even | balanced | embedding+loss | first/last | explicit

    def problems(self, num_layers: int, pp: int, vpp: int) -> list[str]:
        """Why this layout cannot run `num_layers` layers on pp x vpp stages (empty if it can)."""
        out = []
        n = pp * vpp
        if len(self.stages) != n:
            out.append(f"the pipeline layout has {len(self.stages)} stages but pp*vpp = {n}")
        if any(s < 0 for s in self.stages):
            out.append("the pipeline layout has a negative layer count")
        if sum(self.stages) != num_layers:
            verb = "drops" if sum(self.stages) < num_layers else "repeats"
            out.append(
                f"the pipeline layout {verb} layers: its stages hold {sum(self.stages)} layers, "
                f"the model has {num_layers}; every layer must be placed exactly once"
            )
        # the first stage may hold only the embedding, the last only the head and loss
        empty_inner = [i for i, s in enumerate(self.stages[1:-1], start=1) if s == 0]
        if empty_inner:
            out.append(
                f"pipeline stage(s) {empty_inner} hold no layer; only the first (embedding) and "
                f"last (loss) stages may be empty"
            )
        if n == 1 and self.stages and self.stages[0] == 0:
            out.append("a single pipeline stage must hold layers")
        return out

    def rank_layers(self, pp: int) -> list[int]:
        """Layers per pipeline rank (summed over its virtual stages)."""
        return [sum(self.stages[r::pp]) for r in range(pp)]

    def layer_ranges(self) -> list[range]:
        """The global layer indices each virtual stage holds."""
        out, start = [], 0
        for s in self.stages:
            out.append(range(start, start + s))
            start += s
        return out

    def describe(self) -> str:
        """Run-length form, e.g. '4x20 (even)' or '[1, 62x2, 1] (embedding+loss as layers)'."""
        s = self.stages
        if len(set(s)) == 1:
            return f"{len(s)}x{s[0]} ({self.rule})"
        runs: list[list[int]] = []
        for x in s:
            if runs and runs[-1][1] == x:
                runs[-1][0] += 1
            else:
                runs.append([1, x])
        return "[" + ", ".join(f"{n}x{x}" if n > 1 else str(x) for n, x in runs) + f"] ({self.rule})"


def even_layout(num_layers: int, stages: int) -> PipelineLayout | None:
    if num_layers % stages:
        return None
    return PipelineLayout((num_layers // stages,) * stages, "even")


def balanced_layout(
    num_layers: int, stages: int, *, embedding_as_layer: bool = False, loss_as_layer: bool = False
) -> PipelineLayout:
    """Spread layers as evenly as possible; the remainder goes to the middle stages first, then
    the last, then the first (which also hold the embedding / LM head)."""
    emb, loss = int(embedding_as_layer), int(loss_as_layer)
    units = num_layers + emb + loss
    base, rem = divmod(units, stages)
    counts = [base] * stages
    order = list(range(1, stages - 1)) + ([stages - 1] if stages > 1 else []) + [0]
    for i in order[:rem]:
        counts[i] += 1
    counts[0] -= emb
    counts[-1] -= loss
    name = "+".join(x for x, on in (("embedding", emb), ("loss", loss)) if on) or "balanced"
    if name != "balanced":
        name += " as layers"
    return PipelineLayout(tuple(counts), name)


def first_last_layout(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> PipelineLayout:
    """Megatron `--decoder-first/last-pipeline-num-layers`: fixed first/last stage sizes, the rest
    split evenly (vpp must be 1 here; give an explicit layout for interleaved uneven splits)."""
    if vpp != 1:
        raise InputError(
            "--pp-first/--pp-last need vpp = 1; for interleaved uneven splits give "
            "--pp-layout with one count per virtual stage"
        )
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if middle <= 0:
        stages = [x for x in (first, last) if x is not None]
        return PipelineLayout(tuple(stages), "first/last")
    given = " and ".join(f"{flag} {v}" for flag, v in (("--pp-first", first), ("--pp-last", last)) if v is not None)
    verb = "leave" if first is not None and last is not None else "leaves"
    if rest < middle:
        raise InputError(
            f"{given} {verb} {max(rest, 0)} of the model's {num_layers} layers for the {middle} other "
            f"pipeline stage{'s, which need' if middle > 1 else ', which needs'} at least one layer; give at most "
            f"{num_layers - middle} layers to the first and last stages together"
        )
    if rest % middle:
        raise InputError(
            f"{given} {verb} {rest} layers for {middle} middle stages, which does not divide evenly; "
            f"change them or give --pp-layout"
        )
    mid = [rest // middle] * middle
    stages = ([first] if first is not None else []) + mid + ([last] if last is not None else [])
    return PipelineLayout(tuple(stages), "first/last")


def auto_layout(num_layers: int, pp: int, vpp: int) -> PipelineLayout:
    """The layout autopar assumes when none is given: even when it divides; else count the
    embedding and loss as layers when that divides (Megatron-Bridge's 405B recipe); else the
    balanced spread with embedding and loss counted."""
    n = pp * vpp
    if n == 1:
        return PipelineLayout((num_layers,), "even")
    even = even_layout(num_layers, n)
    if even is not None:
        return even
    return balanced_layout(num_layers, n, embedding_as_layer=True, loss_as_layer=True)


def parse_layout(text: str) -> PipelineLayout:
    """`--pp-layout 4,5,5,4`: layers per virtual stage."""
    try:
        stages = tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        raise InputError(f"--pp-layout {quoted(text)} must be comma-separated layer counts, e.g. 4,5,5,4") from None
    return PipelineLayout(stages, "explicit")
