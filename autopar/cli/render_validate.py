"""Terminal tables for `autopar validate`, and the profile files it writes."""

from __future__ import annotations

import datetime
import math
import shlex
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from autopar.calibration.margin import PairedMargin
from autopar.calibration.validate_runs import ValidationReport
from autopar.calibration.validation import CATEGORIES
from autopar.cli.render import TRAINER_LETTERS, Col, console, dropped_line, fitted_table, legend_line
from autopar.figures import INTERVAL_LEVEL


def _figure(v: float) -> str:
    """A published or predicted figure as a table shows it: 14,080 (not 1.408e+04), 412.3, 0.4123."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _signed_figure(v: float) -> str:
    """A shift as a table shows it: +1,392 (not +1.39e+03), -0.0512."""
    return f"{v:+,.0f}" if abs(v) >= 1000 else f"{v:+.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None or v != v else f"{100 * v:.1f}%"


#: the per-row table's columns: the row, its layout and both errors always; the others go, least
#: important first (`drop` 1, 2, ...), when the terminal is too narrow (autopar.cli.render.fitted_table)
ROW_COLUMNS = (
    Col("row", left=True),
    Col("source", left=True, drop=1),
    Col("model", left=True, wraps=True, drop=7),
    Col("GPUs", drop=5),
    Col("GPU", left=True, drop=2),
    Col("layout", left=True),
    Col("tr", left=True, drop=3),
    Col("metric", left=True, drop=6),
    Col("published", drop=6),
    Col("predicted", drop=4),
    Col("error"),
    Col("cv error"),
)


#: rows of a per-row table printed by default: a longer one shows its worst rows (`--all-rows` prints
#: every one, `--json` lists them all)
SHOWN_ROWS = 60


def _worst(items: list, error, all_rows: bool) -> tuple[list, int]:
    """(the items to print, how many are left out): every one up to SHOWN_ROWS or with `all_rows`,
    else the SHOWN_ROWS with the largest |error(item)|, in their own order."""
    if all_rows or len(items) <= SHOWN_ROWS:
        return items, 0
    keep = set(sorted(range(len(items)), key=lambda i: -abs(error(items[i])))[:SHOWN_ROWS])
    return [x for i, x in enumerate(items) if i in keep], len(items) - SHOWN_ROWS


def left_out_line(what: str, n: int) -> str:
    return f"{n:,} more {what} not shown: --all-rows prints every one, --json lists them all."


def rows_table(report: ValidationReport, width: int, all_rows: bool = False) -> tuple[Table, list[str], list[str]]:
    """Predicted vs published per row, fitted to `width`: (the table, the headers dropped, the
    legend of what the shown columns abbreviate). Rows over 20 % off (cross-validated, else in
    sample) in red; a long table shows its worst rows (`_worst`), and the legend says how many it
    leaves out."""
    cv = {r.case.row_id: r.error for r in report.cross_validated.rows} if report.cross_validated else {}
    rows, styles = [], []
    shown, left_out = _worst(report.in_sample.rows, lambda r: cv.get(r.case.row_id, r.error), all_rows)
    for r in shown:
        c = r.case
        e_cv = cv.get(c.row_id)
        styles.append("red" if abs(e_cv if e_cv is not None else r.error) > 0.2 else None)
        rows.append(
            [
                c.row_id,
                c.source,
                c.name,
                str(c.plan.num_gpus),
                c.cluster.gpu.key,
                f"{c.plan.describe()} {c.plan.dtype}",
                TRAINER_LETTERS.get(c.plan.trainer, c.plan.trainer),
                c.metric,
                _figure(c.published),
                _figure(r.predicted),
                f"{100 * r.error:+.1f}%",
                "-" if e_cv is None else f"{100 * e_cv:+.1f}%",
            ]
        )
    t, dropped = fitted_table(f"Predicted vs published throughput ({report.runs})", ROW_COLUMNS, rows, width)
    for row, style in zip(t.rows, styles):
        row.style = style
    legend = ["error: in sample; cv error: leave-one-source-out cross-validated (fit without the row's source)"]
    if left_out:
        legend.append(f"the {SHOWN_ROWS} rows furthest off; " + left_out_line("rows", left_out))
    if "tr" not in dropped:
        legend.insert(
            0,
            "tr (trainer): "
            + legend_line(TRAINER_LETTERS, {r.case.plan.trainer for r in report.in_sample.rows}, _title),
        )
    return t, dropped, legend


def _title(trainer: str) -> str:
    from autopar.spec.trainers import get_trainer

    return get_trainer(trainer).title


def summary_table(report: ValidationReport) -> Table:
    """MAPE per acceptance category, family and source: cross-validated (the headline) and in sample."""
    ins = report.in_sample.summary()
    cv = report.cross_validated.summary() if report.cross_validated else None
    t = Table(
        title="MAPE on throughput: leave-one-source-out cross-validated (headline) and in sample", title_justify="left"
    )
    for col in ("group", "rows", "cross-validated", "max (cv)", "in sample", "max (in sample)", "in 80% interval"):
        t.add_column(col, justify="left" if col == "group" else "right")
    covered = (report.uncertainty() or {}).get("coverage", {})

    def add(label: str, key: str, group: str, style: str | None = None) -> None:
        a = (
            ins[key].get(group)
            if key
            else {"rows": ins["evaluated"], "mape": ins["mape"], "max_abs_error": ins["max_abs_error"]}
        )
        if a is None:
            return
        b = (cv[key].get(group) if key else {"mape": cv["mape"], "max_abs_error": cv["max_abs_error"]}) if cv else None
        t.add_row(
            label,
            str(a["rows"]),
            _pct(b["mape"] if b else None),
            _pct(b["max_abs_error"] if b else None),
            _pct(a["mape"]),
            _pct(a["max_abs_error"]),
            _pct(covered[group]["covered"]) if key == "by_category" and group in covered else "",
            style=style,
        )

    add("all rows", "", "", "bold")
    for g in CATEGORIES:
        add(g, "by_category", g, "bold")
    for g in ins["by_family"]:
        add(f"family: {g}", "by_family", g)
    for g in ins["by_source"]:
        add(f"source: {g}", "by_source", g)
    return t


def new_ground_table(report: ValidationReport) -> Table | None:
    """MAPE per category of the checks that imitate new ground: leave-one-source-out, leaving out
    whole groups of sources, the chronological split and the physics alone (no fit)."""
    checks = [
        ("leave one source out", report.cross_validated),
        ("leave one group out", report.families),
        ("chronological", report.chronological),
        ("physics only", report.physics_only),
    ]
    shown = [(name, r.summary()) for name, r in checks if r is not None]
    if len(shown) < 2:
        return None
    split = f"; {report.chronological.method}" if report.chronological is not None else ""
    t = Table(title=f"MAPE on ground the fit has not seen (rows in brackets{split})", title_justify="left")
    t.add_column("category", justify="left")
    for name, _ in shown:
        t.add_column(name, justify="right")
    for g in ("all rows", *CATEGORIES):
        cells = []
        for _, summ in shown:
            a = summ if g == "all rows" else summ["by_category"].get(g)
            n = a["evaluated"] if g == "all rows" else (a or {}).get("rows")
            cells.append(f"{_pct(a['mape'])} ({n})" if a else "-")
        t.add_row(g, *cells, style="bold" if g == "all rows" else None)
    return t


def coverage_table(report: ValidationReport) -> Table | None:
    """How often the 80 % interval holds per category, by how far from the fit a run is (left out by
    source, by group, chronologically; a user's runs never seen: inside the shipped intervals), the
    first split's with each source weighed alike, and how wide it is (the median span over the
    estimate of the first split's intervals); None without either."""
    u = report.uncertainty() or {}
    first = "the shipped intervals" if report.judged_by_shipped else "leave one source out"
    splits = [(first, u.get("coverage") or {})]
    splits += [(name, c) for name, c in (u.get("coverage_on_new_ground") or {}).items() if c]
    if not splits[0][1]:
        return None
    t = Table(
        title="Runs inside their 80 % interval (rows in brackets; the first split's also with each source "
        "weighed alike, sources in brackets) and its median width",
        title_justify="left",
    )
    t.add_column("category", justify="left")
    t.add_column(splits[0][0], justify="right")
    t.add_column("each source alike", justify="right")
    for name, _ in splits[1:]:
        t.add_column(name, justify="right")
    t.add_column("median width", justify="right")
    for g in ("all rows", *CATEGORIES):
        cells = [f"{_pct(c[g]['covered'])} ({c[g]['rows']})" if g in c else "-" for _, c in splits]
        first = splits[0][1].get(g, {})
        by_source = f"{_pct(first['covered_by_source'])} ({first['sources']})" if "sources" in first else "-"
        row = (g, cells[0], by_source, *cells[1:], _pct(first.get("median_width")))
        t.add_row(*row, style="bold" if g == "all rows" else None)
    return t


def coverage_line(report: ValidationReport) -> str:
    """How often the interval of two plans' step-time ratio holds (autopar.calibration.margin)."""
    return margin_text(report.uncertainty() or {}).strip()


def margin_text(u: dict) -> str:
    """' Two plans' step-time ratio: ...' (autopar.calibration.margin), or '' where not fitted."""
    m, cov = u.get("paired_margin"), u.get("paired_margin_coverage") or {}
    if not m:
        return ""
    model = PairedMargin(**m)
    widths = ", ".join(
        f"+-{100 * math.expm1(model.half_width(k)):.0f} % {words}"
        for k, words in ((0, "no knob apart"), (1, "one"), (3, "three"))
    )
    held = (
        f"; {_pct(cov['covered'])} of the pairs of a source left out fall inside"
        if cov.get("pairs") and math.isfinite(cov.get("covered", math.nan))
        else ""
    )
    return (
        f" Two plans of one profile: their step-time ratio within {widths} (80 %, by the layout knobs "
        f"they differ in, from {model.pairs} pairs of published runs of one source){held}."
    )


def memory_line(report: ValidationReport) -> str:
    """The published memory figures' MAPE per source, and which runs are predicted not to fit (or
    fit only with an option the row does not state)."""
    m = report.memory
    sources = ", ".join(f"{s} {_pct(v['mape'])}" for s, v in m.by_source().items())
    figures = (
        f"Published memory figures: {_pct(m.mape())} MAPE over {len(m.comparisons)} ({sources})."
        if m.comparisons
        else ""
    )
    misses = "; ".join(f"row {f.row_id} needs {f.required_gib:.1f} of {f.capacity_gib:.1f} GiB" for f in m.not_fitting)
    fits = (
        f"{len(m.not_fitting)} of {len(m.fit_checks)} runs predicted not to fit: {misses}."
        if m.not_fitting
        else f"All {len(m.fit_checks)} runs predicted to fit their GPUs."
    )
    assumed = "".join(f" Row {f.row_id} fits with {f.assumed}." for f in m.fit_checks if f.assumed)
    return " ".join(p for p in (figures, fits + assumed) if p)


def print_report(report: ValidationReport, written: list[Path], all_rows: bool = False) -> None:
    out = console()
    rows, dropped, legend = rows_table(report, out.width, all_rows)
    out.print(rows)
    for line in legend + ([note] if (note := dropped_line(dropped)) else []):
        out.print(line)
    out.print(summary_table(report))
    if (ground := new_ground_table(report)) is not None:
        out.print(ground)
    if (covered := coverage_table(report)) is not None:
        out.print(covered)
    if line := coverage_line(report):
        out.print(line)
    n, skipped = len({r.case.row_id.rstrip("d") for r in report.in_sample.rows}), len(report.in_sample.skipped)
    out.print(
        Text(
            f"Evaluated {n} of {n + skipped} rows ({len(report.in_sample.rows)} cases with the dropless "
            f"measurements some rows print). Cross-validated figures: {report.cv_origin}.",
            style="bold",
        )
    )
    memory = ((report.uncertainty() or {}).get("coverage") or {}).get("peak memory")
    if memory and memory.get("rows"):
        out.print(
            f"Peak memory: {_pct(memory['covered'])} of {memory['rows']} measured peaks inside the 80 % "
            f"interval built from the other sources' peaks."
        )
    out.print(memory_line(report))
    if report.fit is not None:
        out.print(fit_table(report))
    if report.in_sample.skipped:
        s = Table(title="Rows not evaluated", title_justify="left")
        for col in ("row", "model", "reason"):
            s.add_column(col)
        not_evaluated = report.in_sample.skipped
        for rid, model, reason in not_evaluated if all_rows else not_evaluated[:SHOWN_ROWS]:
            s.add_row(rid, model, reason)
        out.print(s)
        if len(not_evaluated) > SHOWN_ROWS and not all_rows:
            out.print(left_out_line("rows not evaluated", len(not_evaluated) - SHOWN_ROWS))
    a = Table(title="Assumptions made for fields a row leaves empty", title_justify="left")
    a.add_column("row")
    a.add_column("assumptions")
    assumed = [r for r in report.in_sample.rows if r.case.assumptions]
    for r in assumed if all_rows else assumed[:SHOWN_ROWS]:
        a.add_row(r.case.row_id, "; ".join(r.case.assumptions))
    out.print(a)
    if len(assumed) > SHOWN_ROWS and not all_rows:
        out.print(left_out_line("rows with assumptions", len(assumed) - SHOWN_ROWS))
    for p in written:
        out.print(f"wrote {p}")


def fit_table(report: ValidationReport) -> Table:
    """Each fitted constant: its prior (the physical default), the fitted value, the shift and the
    documented range; a value on a bound is marked (a mechanism the model lacks)."""
    t = Table(
        title="Fitted constants (prior and range: autopar/spec/data/constants.toml; a child profile fits only its own)",
        title_justify="left",
    )
    for col in ("profile", "constant", "prior", "fitted", "shift", "range", ""):
        t.add_column(col, justify="left" if col in ("profile", "constant", "") else "right")
    assert report.fit is not None  # a report with --fit
    for p in report.fit.parameters:
        t.add_row(
            p.profile,
            p.name,
            _figure(p.prior),
            _figure(p.value),
            _signed_figure(p.shift),
            f"[{_figure(p.low)}, {_figure(p.high)}]",
            "ON A BOUND" if p.on_bound else "",
            style="red" if p.on_bound else None,
        )
    for profile, name, value in pinned_constants(report):
        shown = _figure(value)
        t.add_row(profile, name, shown, shown, "+0", f"[{shown}, {shown}]", "fixed by mechanism")
    return t


def pinned_constants(report: ValidationReport) -> list[tuple[str, str, float]]:
    """(profile, constant, value) of the constants the fit would fit but a trainer's mechanism fixes
    (a range of one value: Megatron's dp_overlap, every DP bucket but the last overlapped)."""
    from autopar.calibration.profile_fit import BASE, FITTED, OWN
    from autopar.cost.profiles import pinned, profiles

    assert report.fit is not None
    fitting = {p.profile for p in report.fit.parameters}
    return [
        (prof, name, getattr(profiles()[prof].constants, name))
        for prof in sorted(fitting, key=lambda q: q != BASE)
        for name in (FITTED if prof == BASE else OWN.get(prof, ()))
        if pinned(prof, name)
    ]


def write_outputs(
    report: ValidationReport, trainer: str | None, profile_yaml: str | None, profiles_toml: str | None
) -> list[Path]:
    """--write-profile (one trainer's constants as a cluster YAML) and --write-profiles (profiles.toml)."""
    from autopar.calibration.validate_runs import write_profiles

    out: list[Path] = []
    command = shlex.join(["autopar", *sys.argv[1:]]) if sys.argv else "autopar validate --fit"
    if profiles_toml:
        out += write_profiles(report, profiles_toml, command, datetime.date.today().isoformat())
    if profile_yaml:
        out.append(_write_cluster_profile(report, trainer or "megatron", profile_yaml))
    return out


def _write_cluster_profile(report: ValidationReport, trainer: str, path: str) -> Path:
    from dataclasses import asdict

    import yaml

    from autopar.cost.profiles import profile_of
    from autopar.errors import InputError

    assert report.fit is not None  # --write-profile needs --fit
    consts = report.fit.constants[profile_of(trainer).name]
    p = Path(path)
    try:
        p.write_text(yaml.safe_dump({"gpu": "h100-sxm", "constants": asdict(consts)}, sort_keys=False))
    except OSError as e:
        raise InputError(f"cannot write '{path}' ({e.strerror}); choose a writable path") from None
    return p


def report_json(report: ValidationReport, written: list[Path]) -> dict:
    """The `--json` document of `autopar validate`: the in-sample rows and summaries, the checks on
    new ground, the coverage of the intervals, the fitted constants and the published memory."""
    return report.in_sample.to_dict() | {
        "cross_validated": (report.cross_validated.summary() if report.cross_validated else None),
        "cross_validation_origin": report.cv_origin,
        # the checks that imitate new ground (autopar.calibration.new_ground): null where not
        # computed (your runs without --cross-validate; chronological: sources without a date)
        "chronological": report.chronological.summary() if report.chronological else None,
        "families": report.families.summary() if report.families else None,
        "physics_only": report.physics_only.summary() if report.physics_only else None,
        "coverage": (report.uncertainty() or {}).get("coverage"),
        "coverage_on_new_ground": (report.uncertainty() or {}).get("coverage_on_new_ground"),
        # the error model of two plans' step-time ratio (autopar.calibration.margin)
        "paired_margin": (report.uncertainty() or {}).get("paired_margin"),
        "paired_margin_coverage": (report.uncertainty() or {}).get("paired_margin_coverage"),
        INTERVAL_LEVEL: (report.uncertainty() or {}).get("level"),
        "fitted": [
            {
                "profile": p.profile,
                "constant": p.name,
                "prior": p.prior,
                "value": p.value,
                "low": p.low,
                "high": p.high,
                "on_bound": p.on_bound,
            }
            for p in report.fit.parameters
        ]
        if report.fit
        else None,
        "fixed_by_mechanism": [
            {"profile": prof, "constant": name, "value": value} for prof, name, value in pinned_constants(report)
        ]
        if report.fit
        else None,
        "published_memory": {
            "mape": report.memory.mape(),
            "by_source": report.memory.by_source(),
            "runs_checked": len(report.memory.fit_checks),
            "not_fitting": [
                {"row_id": f.row_id, "required_gib": f.required_gib, "capacity_gib": f.capacity_gib}
                for f in report.memory.not_fitting
            ],
            "fits_with_unstated_option": {f.row_id: f.assumed for f in report.memory.fit_checks if f.assumed},
        },
        "written": [str(p) for p in written],
    }
