"""The page's building blocks: one self-contained HTML document (CSS, the table-sorting and
figure-drawing scripts and plotly.js inlined, no network access), figures as JSON drawn on
load, sortable tables and key-value tables."""

from __future__ import annotations

import html
import math

import pandas as pd

from autopar import __version__
from autopar.report import figure_base as F
from autopar.report.format import fmt

CSS = """
:root{--fg:#1d1d1f;--muted:#666;--line:#e3e3e3;--accent:#1f6feb;--diff:#fff6d6;--best:#0a7f2e}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:var(--fg);margin:0;background:#fff;
  font-size:13.5px}
main{max-width:1280px;margin:0 auto;padding:18px 28px 60px}
h1{font-size:22px;margin:8px 0 4px}
h2{font-size:18px;margin:34px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
.answer{font-size:16px;font-weight:600;margin:10px 0 4px}.why{color:#333;margin:4px 0 10px}
.muted{color:var(--muted)}nav a{margin-right:14px;color:var(--accent);text-decoration:none}
table{border-collapse:collapse;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{padding:4px 7px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{background:#f4f4f6;font-weight:600;position:sticky;top:0}
td.t,th.t{text-align:left}
table.kv td{text-align:left;white-space:normal;overflow-wrap:anywhere}
pre.cmd{background:#f4f4f6;border:1px solid var(--line);padding:6px 10px;margin:2px 0 10px;overflow-x:auto;
  white-space:pre}
table.kv td:first-child{font-weight:600;color:#444;min-width:150px;white-space:nowrap}
table.sortable th{cursor:pointer;user-select:none}table.sortable th:hover{background:#e8e8ee}
table.sortable th[data-dir=asc]::after{content:" \\25B2"}table.sortable th[data-dir=desc]::after{content:" \\25BC"}
tr.win td{background:#eef8ee}
tr.sec td{background:#f4f4f6;font-weight:700;text-align:left}
tr.diff td{background:var(--diff)}tr.diff td.m{font-weight:700}
td.best{color:var(--best);font-weight:700}
.scroll{overflow-x:auto}.fig{margin:6px 0 18px}
.note{color:var(--muted);font-size:13px}
ul.sure{margin:4px 0 10px;padding-left:20px;color:#333}ul.sure li{margin:2px 0}
td.extrapolated{color:#b35c00}td[title]{cursor:help}td.calibrated,td.extrapolated{text-decoration:underline dotted}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""

SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(table){
  table.querySelectorAll('th').forEach(function(th, i){
    th.addEventListener('click', function(){
      var dir = th.dataset.dir === 'asc' ? 'desc' : 'asc';
      table.querySelectorAll('th').forEach(function(h){ delete h.dataset.dir; });
      th.dataset.dir = dir;
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var key = function(r){ var c = r.cells[i], v = c.dataset.v !== undefined ? c.dataset.v : c.textContent;
                             var n = Number(v); return (v === '' || isNaN(n)) ? v : n; };
      rows.sort(function(a, b){ var x = key(a), y = key(b);
        var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
        return dir === 'asc' ? c : -c; });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
});
"""

#: draws the figures: those in the first screen at once, then the rest one per task (so the page
#: is usable while they draw); marks <html data-plotted-ms> when the first screen is drawn and
#: data-drawn-ms when every figure is (ms since navigation start; the benchmark and tests read them)
DRAW_JS = """
(function(){
  var figs = Array.prototype.slice.call(document.querySelectorAll('div.plotly-fig'));
  var root = document.documentElement, left = figs.length;
  var stamp = function(name){ root.setAttribute(name, String(Math.round(performance.now()))); };
  var draw = function(div){
    if (div.getAttribute('data-state')) return;
    div.setAttribute('data-state', 'drawing');
    var spec = JSON.parse(document.getElementById(div.id + '-json').textContent);
    Plotly.newPlot(div, spec.data, spec.layout, spec.config).then(function(){
      div.setAttribute('data-state', 'drawn');
      if (--left === 0) stamp('data-drawn-ms');
    });
  };
  var inView = function(div){ return div.getBoundingClientRect().top < window.innerHeight + 200; };
  figs.filter(inView).forEach(draw);
  stamp('data-plotted-ms');
  if (!left) stamp('data-drawn-ms');
  var queue = figs.filter(function(d){ return !d.getAttribute('data-state'); });
  var next = function(){ if (queue.length) { draw(queue.shift()); setTimeout(next, 0); } };
  setTimeout(next, 0);
  window.addEventListener('scroll', function(){ queue.filter(inView).forEach(draw); }, {passive: true});
})();
"""

e = html.escape

#: the table kind of a support column: the column, its `_reason` as a tooltip
SUPPORT_CELL = "support"


def page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="autopar {e(__version__)}"><title>{e(title)}</title>'
        f"<style>{CSS}</style></head>\n"
        f"<body><main>\n{body}\n</main>\n<script>{SORT_JS}</script>\n"
        f'<script type="text/javascript">{F.plotly_js()}</script>\n<script>{DRAW_JS}</script>\n</body></html>\n'
    )


def fig(fig: dict, div_id: str) -> str:
    """A placeholder of the figure's height and its JSON; DRAW_JS draws it once plotly.js is loaded."""
    return (
        f'<div class="fig"><div id="{div_id}" class="plotly-fig" style="height:{F.height(fig)}px"></div>'
        f'<script type="application/json" id="{div_id}-json">{F.to_json(fig)}</script></div>'
    )


def cell(value, kind: str = "", text: bool = False, sort_value=None, cls: str = "") -> str:
    v = value.item() if hasattr(value, "item") else value
    sv = sort_value if sort_value is not None else v
    data = ""
    if isinstance(sv, (int, float)) and not isinstance(sv, bool):
        data = f' data-v="{sv!r}"' if sv == sv else ' data-v=""'
    classes = " ".join(c for c in ("t" if text else "", cls) if c)
    return f"<td{f' class={chr(34)}{classes}{chr(34)}' if classes else ''}{data}>{e(fmt(v, kind))}</td>"


def interval_cell(low, high, kind: str = "s") -> str:
    """'low-high' of an interval, sorted by its low end; the exact ends in data-low / data-high."""
    lo, hi = (float(v) if v is not None else float("nan") for v in (low, high))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return '<td data-v="">-</td>'
    return f'<td data-v="{lo!r}" data-low="{lo!r}" data-high="{hi!r}">{e(fmt(lo, kind))}-{e(fmt(hi, kind))}</td>'


def support_cell(support, reason) -> str:
    """'calibrated' or 'extrapolated', the reason as its tooltip; '-' when the run has none."""
    s = support if isinstance(support, str) else ""
    if not s:
        return '<td class="t">-</td>'
    why = reason if isinstance(reason, str) else ""
    return f'<td class="t {e(s)}" title="{e(why)}">{e(s)}</td>'


def _cell_of(r: pd.Series, c: str, k: str) -> str:
    if k == "html":
        return f'<td class="t">{r[c]}</td>'
    if k == "interval":  # c: the figure; the frame has c_low and c_high
        return interval_cell(r.get(f"{c}_low"), r.get(f"{c}_high"))
    if k == SUPPORT_CELL:  # c: the support column; the frame has c_reason
        return support_cell(r.get(c), r.get(f"{c}_reason"))
    return cell(r[c], "" if k == "t" else k, text=k == "t")


def table(df: pd.DataFrame, columns: list[tuple[str, str, str]], *, sortable: bool = True, row_class=None) -> str:
    """columns: (frame column, header, kind); kind 't' = left-aligned text, 'html' = trusted markup
    (built and escaped by the caller), 'interval' = the column's `_low` and `_high` as 'low-high'
    (seconds), 'support' = the column and its `_reason` as a tooltip."""
    left = ("t", "html", SUPPORT_CELL)
    head = "".join(f'<th class="{"t" if k in left else ""}">{e(h)}</th>' for _, h, k in columns)
    rows = []
    for i, (_, r) in enumerate(df.iterrows()):
        cls = row_class(i, r) if row_class else ""
        cells = "".join(_cell_of(r, c, k) for c, _, k in columns)
        rows.append(f"<tr{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="{"sortable" if sortable else ""}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def kv(df: pd.DataFrame) -> str:
    return (
        '<table class="kv">'
        + "".join(f"<tr><td>{e(str(a))}</td><td>{e(str(b))}</td></tr>" for a, b in zip(df["item"], df["value"]))
        + "</table>"
    )
