"""The whole training run a user plans, beyond one step: how many tokens, by when, at what price
(`--tokens 15T --deadline 60d --price-per-gpu-hour 2.5 --budget 5M`), and how reliable the cluster
is (a cluster file's `reliability:` mapping). autopar.cost.goodput turns them into days, GPU-hours,
cost and goodput.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from autopar.errors import InputError, did_you_mean, quoted
from autopar.spec.hardware import get_gpu, gpu_names

# re-exported: the run's quantities come with the cluster's reliability (autopar.spec.reliability)
from autopar.spec.reliability import DEFAULT_CHECKPOINT_GBPS_PER_GPU as DEFAULT_CHECKPOINT_GBPS_PER_GPU
from autopar.spec.reliability import DEFAULT_INTERRUPTIONS_PER_GPU_HOUR as DEFAULT_INTERRUPTIONS_PER_GPU_HOUR
from autopar.spec.reliability import Reliability as Reliability
from autopar.spec.schema import check_name

#: the largest values the flags and the cluster file accept (beyond them the input is a typo)
MAX_TOKENS = 1e18
MAX_DEADLINE_S = 100 * 365 * 86_400.0
MAX_PRICE = 1e6
MAX_BUDGET = 1e15

_SI = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_DURATION = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0}


@dataclass(frozen=True)
class TrainingRun:
    """What the whole run must do: `tokens` to train on, optionally by `deadline_s`, at
    `price_per_gpu_hour` (one price, or one per GPU kind), within `budget` (same currency)."""

    tokens: float
    deadline_s: float | None = None
    price_per_gpu_hour: float | None = None
    prices_by_gpu: dict = field(default_factory=dict)  # GPU kind -> price, overriding the single price
    budget: float | None = None

    def price_for(self, gpu) -> float | None:
        """The price per GPU-hour of a GPU (a GpuSpec: priced by its preset key, an alias, or the
        name a cluster file gives it), None when the run is not priced; one line when the list
        misses it, or prices it twice (by its base preset and by its own name)."""
        if not self.priced:
            return None
        names = {gpu.key.lower(), gpu.name.lower()}
        hits = [k for k in self.prices_by_gpu if k in names]
        if len(hits) > 1:
            raise InputError(
                f"--price-per-gpu-hour prices the GPU {quoted(gpu.name)} twice, as {' and as '.join(hits)} (a "
                f"cluster file's GPU is priced by its name or by its base preset, not both); give one price"
            )
        price = self.prices_by_gpu[hits[0]] if hits else self.price_per_gpu_hour
        if price is None:
            raise InputError(
                f"--price-per-gpu-hour gives no price for {quoted(_label(gpu))}; add {_label(gpu)}=PRICE, or one "
                f"bare price for every GPU kind"
            )
        return price

    def check_prices(self, gpus) -> None:
        """Every GPU of the question priced once (price_for), and every kind the list names a GPU
        preset or one of these GPUs (by its name): else one line (a typo would price nothing)."""
        known = set(gpu_names()) | {n for g in gpus for n in (g.key.lower(), g.name.lower())}
        for kind in self.prices_by_gpu:  # first: a typo explains the price that is then missing
            if kind not in known:
                ours = ", ".join(dict.fromkeys(_label(g) for g in gpus))
                raise InputError(
                    f"--price-per-gpu-hour prices {quoted(kind)}, which is no GPU preset and no GPU of this "
                    f"question ({ours}){did_you_mean(kind, sorted(known))}; price a GPU by its preset or by the "
                    f"name its cluster file gives it"
                )
        for gpu in gpus:
            self.price_for(gpu)

    def check_one_step(self, global_batch: int, seq_len: int) -> None:
        """One line when --tokens is fewer than one step trains on (global batch x sequence length):
        a run takes whole steps, so it could not even finish its first."""
        step = global_batch * seq_len
        if self.tokens < step:
            raise InputError(
                f"--tokens {tokens_text(self.tokens)} is fewer than one step trains on: {step:,} tokens "
                f"({global_batch:,} sequences of {seq_len:,}); give --tokens {step} or more "
                f"(a run trains on whole steps), e.g. --tokens 15T"
            )

    @property
    def priced(self) -> bool:
        return self.price_per_gpu_hour is not None or bool(self.prices_by_gpu)

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "deadline_s": self.deadline_s,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "prices_by_gpu": dict(self.prices_by_gpu),
            "budget": self.budget,
        }


def parse_tokens(text: str) -> float:
    """'15T', '300B', '2.5e12', '500M' -> tokens."""
    value = _si_number(text, "--tokens", "a token count such as 15T, 300B or 2.5e12")
    if 0 < value < 1:
        raise InputError(f"--tokens {quoted(text)} is fewer than one token; give a token count such as --tokens 15T")
    return _in_range(value, text, "--tokens", MAX_TOKENS, "15T")


def parse_duration(text: str, flag: str = "--deadline") -> float:
    """'60d', '36h', '8w', '90min', '3600s' -> seconds (a unit is required: '60' could be anything)."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|min|m|h|d|w)\s*", str(text), re.IGNORECASE)
    if not m:
        raise InputError(f"{flag} {quoted(text)} is not a duration; give a number and a unit: 60d, 36h, 8w, 90min")
    seconds = float(m.group(1)) * _DURATION[m.group(2).lower()]
    return _in_range(seconds, text, flag, MAX_DEADLINE_S, "60d", "100 years")


def parse_prices(text: str) -> tuple[float | None, dict]:
    """'2.5' (every GPU kind) or 'h100-sxm=2.5,b200=4' (per kind; a bare number among them is the
    price of the others) -> (price, {kind: price}). A preset or its alias is keyed by the preset
    (h100 -> h100-sxm), any other name as given, lower-case (a GPU a cluster file names: checked
    against the question's GPUs by TrainingRun.check_prices). A kind priced twice is one line."""
    single: float | None = None
    by_kind: dict[str, float] = {}
    given: dict[str, str] = {}
    for part in str(text).split(","):
        kind, _, value = part.rpartition("=")
        price = _si_number(value, "--price-per-gpu-hour", "a price per GPU-hour such as 2.5, or h100-sxm=2.5,b200=4")
        _in_range(price, value, "--price-per-gpu-hour", MAX_PRICE, "2.5")
        kind = kind.strip()
        if kind:
            key = _gpu_key(kind)
            if key in by_kind:
                twice = f"{quoted(given[key], 40)} and {quoted(kind, 40)}" if given[key] != kind else quoted(kind, 40)
                raise InputError(
                    f"--price-per-gpu-hour {quoted(text)} prices {key} twice ({twice}); give one price per GPU kind"
                )
            by_kind[key], given[key] = price, kind
        elif single is None:
            single = price
        else:
            raise InputError(
                f"--price-per-gpu-hour {quoted(text)} gives two prices for every GPU; give one, or KIND=PRICE pairs"
            )
    return single, by_kind


def _gpu_key(kind: str) -> str:
    """A priced kind's key: its preset's (aliases resolved), else the name, lower-case."""
    check_name(kind, "--price-per-gpu-hour: a GPU kind", 64)
    try:
        return get_gpu(kind).key
    except InputError:
        return kind.lower()


def _label(gpu) -> str:
    """How the price list names a GPU: its preset key; the name a cluster file gives a GPU (on a
    preset base, or a GpuSpec of its own without a key); else its key ('local')."""
    if gpu.key in gpu_names():
        return gpu.key if gpu.name == get_gpu(gpu.key).name else gpu.name
    return gpu.name if gpu.key == "custom" else gpu.key


def parse_budget(text: str) -> float:
    """'5M', '$2.5M', '750000' -> an amount in the price's currency."""
    value = _si_number(str(text).strip().lstrip("$"), "--budget", "an amount such as 5M or 750000")
    return _in_range(value, text, "--budget", MAX_BUDGET, "5M")


# ---- the run's quantities written back the way the flags take them ------------------------------


#: at most this many decimals in a figure below 1 (a smaller one reads as 0)
MAX_DECIMALS = 6


def significant(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant digits, never in e-notation (a person reads '14,080', not
    '1.408e+04'; '0.00329', not '3.29e-03'): thousands separated, trailing zeros dropped, at most
    MAX_DECIMALS decimals."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    decimals = min(MAX_DECIMALS, max(0, digits - 1 - math.floor(math.log10(abs(x)))))
    text = f"{x:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def scaled_text(x: float, units: tuple[tuple[str, float], ...], digits: int = 3) -> str:
    """`x` in the largest of `units` ((suffix, size), largest first) it reaches, to `digits`
    significant digits (significant): 3.29e6 with M, k -> '3.29M'; 412 -> '412'."""
    for unit, div in units:
        if abs(x) >= div:
            return significant(x / div, digits) + unit
    return significant(x, digits)


_TOKEN_UNITS = (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3))
_AMOUNT_UNITS = (("B", 1e9), ("M", 1e6), ("k", 1e3))


def tokens_text(tokens: float) -> str:
    """15e12 -> '15T' (the way --tokens is written)."""
    return scaled_text(tokens, _TOKEN_UNITS)


def money_text(x: float) -> str:
    """An amount in the price's currency: 21,682,581 -> '21.7M'; below 1,000 with cents: '412.50'."""
    return scaled_text(x, _AMOUNT_UNITS) if abs(x) >= 1e3 else f"{x:.2f}"


def gpu_hours_text(hours: float) -> str:
    """GPU-hours of a run: 3,290,000 -> '3.29M', 14,080 -> '14.1k', 0.25 -> '0.25'; 'never' when
    infinite (a run whose goodput is 0)."""
    return scaled_text(hours, _AMOUNT_UNITS) if math.isfinite(hours) else "never"


def never_text(x: float, spec: str) -> str:
    """`x` formatted with `spec` ("{:,.1f} days"), or 'never' when it is infinite or not a number:
    the days of a run whose goodput is 0, the MTBF of a cluster that is never interrupted."""
    return spec.format(x) if math.isfinite(x) else "never"


def deadline_text(seconds: float) -> str:
    """5,184,000 s -> 'the 60-day deadline'."""
    return f"the {significant(seconds / 86_400)}-day deadline"


def training_run(
    tokens: str | None, deadline: str | None = None, price: str | None = None, budget: str | None = None
) -> TrainingRun | None:
    """The flags as one TrainingRun (None when --tokens is not given), or one line saying what is
    missing: a deadline, price or budget means nothing without the run's size."""
    given = [
        f for f, v in (("--deadline", deadline), ("--price-per-gpu-hour", price), ("--budget", budget)) if v is not None
    ]
    if tokens is None:
        if given:
            raise InputError(
                f"{given[0]} needs --tokens (how many tokens the run trains on) to time or price the "
                f"run; add e.g. --tokens 15T"
            )
        return None
    single, by_kind = parse_prices(price) if price is not None else (None, {})
    if budget is not None and price is None:
        raise InputError("--budget needs --price-per-gpu-hour to price the run; add e.g. --price-per-gpu-hour 2.5")
    return TrainingRun(
        tokens=parse_tokens(tokens),
        deadline_s=None if deadline is None else parse_duration(deadline),
        price_per_gpu_hour=single,
        prices_by_gpu=by_kind,
        budget=None if budget is None else parse_budget(budget),
    )


def _si_number(text: object, flag: str, what: str) -> float:
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgtp]?)\s*", str(text), re.IGNORECASE)
    if not m:
        raise InputError(f"{flag} {quoted(text)} is not {what}")
    value = float(m.group(1)) * _SI[m.group(2).lower()]
    if not math.isfinite(value):
        raise InputError(f"{flag} {quoted(text)} is not {what}")
    return value


def _in_range(value: float, text: object, flag: str, most: float, example: str, most_text: str = "") -> float:
    """`value` when above 0 and at most `most`, else one line quoting the option as given."""
    if not 0 < value <= most:
        raise InputError(
            f"{flag} {quoted(text)} must be above 0 and at most {most_text or f'{most:g}'}; give e.g. {flag} {example}"
        )
    return value
