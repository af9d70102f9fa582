"""The page of `autopar compare`: several estimated layouts side by side (`compare.Comparison`),
every metric a row, the rows that differ shaded and the best ranked value green, then the
breakdowns of step time, memory and communication; one HTML string (`page.page`).
`html.write_compare` writes it."""

from __future__ import annotations

import time

from autopar import __version__
from autopar.report import compare_tables as C
from autopar.report.breakdown_figures import comm_figure, memory_figure, time_figure
from autopar.report.format import compare_kind
from autopar.report.page import cell, e, fig, page
from autopar.report.top_tables import memory_breakdown, time_breakdown


def compare_html(cmp) -> str:
    """cmp: autopar.report.compare.Comparison."""
    q = cmp.question
    labels = cmp.labels
    title = f"autopar compare: {len(labels)} layouts of {q.describe()}"
    parts = [
        f"<h1>{e(title)}</h1>",
        f'<p class="why">{e(q.model.name)} on {q.num_gpus} x {q.cluster.gpu.key} ({q.cluster.gpus_per_node} per '
        f"node), sequence length {q.seq_len}. Rows that differ are shaded. Green: the best value of a row where "
        f"lower or higher is better whatever the layout (step time, throughput, MFU, peak memory, headroom); "
        f"the parts of a total (its time, memory and traffic terms, the bubble) and HFU (which counts "
        f"recomputation) are not ranked, since one layout trades one part for another.</p>",
        '<table class="kv">'
        + "".join(f"<tr><td>{e(it.label)}</td><td>{e(it.source)}</td></tr>" for it in cmp.items)
        + "</table>",
    ]
    t = cmp.table
    head = '<th class="t">metric</th>' + "".join(f"<th>{e(lab)}</th>" for lab in labels)
    rows, section = [], None
    for _, r in t.iterrows():
        if r["section"] != section:
            section = r["section"]
            rows.append(f'<tr class="sec"><td colspan="{len(labels) + 1}">{e(section)}</td></tr>')
        kind = compare_kind(r["section"], r["key"])
        best = set(str(r["best"]).split(", ")) if r["best"] else set()
        cells = "".join(
            cell(
                r[lab],
                kind,
                text=not isinstance(r[lab], (int, float)) or isinstance(r[lab], bool),
                cls="best" if lab in best else "",
            )
            for lab in labels
        )
        better = f"{r['better']} is better" if r["better"] else ""
        hint = f' <span class="muted">({e(better)})</span>' if better else ""
        cls = ' class="diff"' if r["differs"] else ""
        title = e(r["key"] + (f" ({better})" if better else ""))
        rows.append(f'<tr{cls}><td class="t m" title="{title}">{e(r["metric"])}{hint}</td>{cells}</tr>')
    parts.append(
        f'<h2 id="table">Side by side</h2><div class="scroll"><table class="cmp"><thead><tr>{head}'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )
    est_rows = C.estimate_rows(labels, cmp.estimate_dicts())
    parts.append(
        '<h2 id="breakdown">Breakdowns</h2>'
        + fig(time_figure(time_breakdown(est_rows, labels)), "fig-time")
        + fig(memory_figure(memory_breakdown(est_rows, labels)), "fig-memory")
        + fig(comm_figure(C.comm_breakdown(est_rows, labels)), "fig-comm")
    )
    parts.append(
        f"<footer>autopar {e(__version__)}; estimates of the analytic cost model; written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}.</footer>"
    )
    return page(title, "\n".join(parts))
