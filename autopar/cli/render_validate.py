"""Terminal tables for `autopar validate`."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from autopar.cost.published import ValidationResult


def validation_tables(result: ValidationResult, path) -> list:
    t = Table(title=f"Predicted vs published throughput ({path})", title_justify="left")
    for col in ("row", "model", "GPUs", "layout", "metric", "published", "predicted", "error"):
        t.add_column(col, justify="right" if col in ("GPUs", "published", "predicted", "error") else "left")
    for r in result.rows:
        c = r.case
        style = "red" if abs(r.error) > 0.15 else None
        t.add_row(c.row_id, c.name[:28], str(c.plan.num_gpus), f"{c.plan.describe()} {c.plan.dtype}", c.metric,
                  f"{c.published:,.4g}", f"{r.predicted:,.4g}", f"{100 * r.error:+.1f}%", style=style)
    out: list = [t]
    out.append(Text(f"Evaluated {len(result.rows)} of {len(result.rows) + len(result.skipped)} rows: "
                    f"MAPE {100 * result.mape:.1f}% on throughput, max |error| {100 * result.max_error:.1f}%",
                    style="bold"))
    if result.skipped:
        s = Table(title="Rows not evaluated", title_justify="left")
        s.add_column("row")
        s.add_column("model")
        s.add_column("reason")
        for rid, model, reason in result.skipped:
            s.add_row(rid, model, reason)
        out.append(s)
    a = Table(title="Assumptions made for fields a row leaves empty", title_justify="left")
    a.add_column("row")
    a.add_column("assumptions")
    for r in result.rows:
        if r.case.assumptions:
            a.add_row(r.case.row_id, "; ".join(r.case.assumptions))
    out.append(a)
    return out


def fit_summary(fitted, write_profile: str | None) -> None:
    """Print the fitted constants (and write them as a cluster profile when asked)."""
    from dataclasses import asdict

    from autopar.cli.render import console

    out = console()
    f = fitted.fit
    t = Table(title="Fitted constants (bounded least squares on log throughput ratio)", title_justify="left")
    t.add_column("constant")
    t.add_column("value", justify="right")
    for n in f.names:
        t.add_row(n, f"{getattr(f.constants, n):.4g}")
    out.print(t)
    out.print(f"MAPE before {100 * abs(f.initial_residuals).mean():.1f}% -> after {100 * abs(f.residuals).mean():.1f}% "
                    f"({f.message})")
    if write_profile:
        import yaml

        with open(write_profile, "w") as fh:
            yaml.safe_dump({"gpu": "h100-sxm", "constants": asdict(f.constants)}, fh, sort_keys=False)
        out.print(f"wrote {write_profile}")
