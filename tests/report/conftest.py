"""Shared fixtures of the report tests: real run directories (written by the search layer in this
process), the `autopar` CLI with the report commands as a subprocess, and headless Chromium.

Helpers are handed out as fixtures (not imported), so the tests work in any pytest import mode.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# `python -m autopar` with the report commands registered whether or not autopar/cli/__init__.py
# lists them yet (importing a command module adds its command to the app)
CLI_SHIM = (
    "import sys; import autopar.cli.report, autopar.cli.compare; from autopar.cli import main; main(sys.argv[1:])"
)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("COLUMNS", "160")
    return env


def _search(run_dir: Path, num_gpus: int = 256, **opts):
    from autopar.search.run import SearchOptions, run_search
    from autopar.search.scenarios import global_batch
    from autopar.search.space import load_space
    from autopar.spec.hardware import default_cluster
    from autopar.spec.presets import get_preset
    from autopar.spec.question import Question

    space = load_space("default")
    m = get_preset("llama3-70b")
    q = Question(
        model=m,
        num_gpus=num_gpus,
        cluster=default_cluster("h100-sxm"),
        seq_len=m.seq_len,
        global_batch_size=global_batch(space, m.seq_len, None),
    )
    return run_search(q, SearchOptions(space=space, run_dir=run_dir, **opts))


@pytest.fixture(scope="session")
def run70(tmp_path_factory) -> Path:
    """`autopar search --model 70b --gpus 256` (exhaustive): plans.parquet, top.json, search.json."""
    d = tmp_path_factory.mktemp("r70")
    _search(d)
    return d


@pytest.fixture(scope="session")
def run70_128(tmp_path_factory) -> Path:
    """The same question on 128 GPUs (the other scenario of a what-if)."""
    d = tmp_path_factory.mktemp("r70_128")
    _search(d, num_gpus=128)
    return d


@pytest.fixture(scope="session")
def run_optuna(tmp_path_factory) -> Path:
    """The 70B / 256 question forced through Optuna (20 TPE trials, journal storage)."""
    d = tmp_path_factory.mktemp("r70o")
    _search(d, max_exhaustive=0, n_trials=20, seed=0, storage=str(d / "study.log"))
    return d


def write_trials(run_dir: Path, rows: list[tuple[dict, dict, dict]]) -> list[Path]:
    """trials/*.json in the trials layer's format: plan, predicted, measured."""
    t = run_dir / "trials"
    t.mkdir(exist_ok=True)
    out = []
    for i, (plan, pred, meas) in enumerate(rows):
        p = t / f"trial{i:02d}.json"
        p.write_text(json.dumps({"plan": plan, "predicted": pred, "measured": meas}))
        out.append(p)
    return out


#: what a run directory written before the intervals (autopar.calibration.uncertainty) lacks
INTERVAL_COLUMNS = [
    f"{f}_{end}"
    for f in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "peak_memory_bytes")
    for end in ("low", "high")
] + ["support_gaps"]
INTERVAL_KEYS = (
    "step_time_s_interval",
    "tokens_per_s_interval",
    "tokens_per_s_per_gpu_interval",
    "peak_memory_bytes_interval",
    "interval_level",
    "support",
    "support_reason",
)


@pytest.fixture(scope="session")
def run70_old(run70: Path, tmp_path_factory) -> Path:
    """A copy of the 70B run directory as autopar wrote it before the intervals: no interval or
    support columns in scatter.parquet, no intervals or support in top.json, no sureness in
    search.json."""
    import pandas as pd

    d = tmp_path_factory.mktemp("r70_old")
    plans = pd.read_parquet(run70 / "scatter.parquet")
    assert set(INTERVAL_COLUMNS) <= set(plans.columns)  # else the copy would test nothing
    plans.drop(columns=INTERVAL_COLUMNS).to_parquet(d / "scatter.parquet")
    top = json.loads((run70 / "top.json").read_text())

    def strip(entry):
        return {k: v for k, v in entry.items() if k not in INTERVAL_KEYS} if isinstance(entry, dict) else entry

    top["top"] = [strip(e) for e in top["top"]]
    top["pareto"] = [strip(e) for e in top.get("pareto", [])]
    top["per_trainer"] = {k: strip(v) for k, v in (top.get("per_trainer") or {}).items()}
    # the answer line as the search wrote it then: no margin's interval (autopar.search.results.why_winner)
    top["why"] = f"{top['top'][0]['plan_name']} beats the runner-up, {top['top'][1]['plan_name']}."
    (d / "top.json").write_text(json.dumps(top))
    search = json.loads((run70 / "search.json").read_text())
    search.pop("sureness", None)
    (d / "search.json").write_text(json.dumps(search))
    return d


@pytest.fixture(scope="session")
def full_run(run_optuna: Path, run70_128: Path) -> Path:
    """The Optuna run with every optional section: three trials of its top plans and a what-if
    with the 128-GPU run."""
    top = json.loads((run_optuna / "top.json").read_text())["top"]
    rows = [
        (
            e["plan"],
            {"step_time_s": e["step_time_s"], "peak_memory_bytes": e["peak_memory_bytes"]},
            {"step_time_s": e["step_time_s"] * f, "peak_memory_bytes": e["peak_memory_bytes"] * g},
        )
        for e, f, g in zip(top[:3], (1.1, 0.95, 1.25), (0.9, 1.02, 1.0))
    ]
    write_trials(run_optuna, rows)
    from autopar.report.html import write_reports

    write_reports([run70_128, run_optuna])
    return run_optuna


def _run_cli(*args, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI_SHIM, *[str(a) for a in args]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=_env(),
    )


def _run_in_process(*args) -> SimpleNamespace:
    """autopar.cli.main(ARGS) in this process (much faster than a subprocess): returncode, stdout,
    stderr as a subprocess would see them. Unexpected exceptions propagate (and fail the test)."""
    import contextlib
    import io

    import autopar.cli.compare  # noqa: F401  (registers the command)
    import autopar.cli.report  # noqa: F401
    from autopar.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.fixture(scope="session")
def cli():
    """cli(*args) -> (returncode, stdout, stderr) of `autopar ARGS`, run in this process."""
    return _run_in_process


@pytest.fixture(scope="session")
def cli_subprocess():
    """cli_subprocess(*args) -> CompletedProcess of `python -m autopar ARGS` (report commands
    registered), for the end-to-end cases."""
    return _run_cli


# ---- headless Chromium ---------------------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
    "--enable-logging=stderr",
    "--v=0",
    # no network: an unreachable proxy for every scheme, and names that never resolve
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]

#: injected first into <head> of a copy of the page: records console.error/warn, uncaught errors,
#: failed resource loads and rejected promises, and, once every figure has drawn (or after 20 s of
#: virtual time), writes what it saw as JSON into <script id="__probe">
PROBE_JS = r"""
<script>
(function(){
  var errors = [], warnings = [];
  var str = function(a){ return Array.prototype.map.call(a, function(x){
    try {
      return typeof x === 'string' ? x : (x && x.stack) || JSON.stringify(x);
    } catch (e) {
      return String(x);
    }
  }).join(' '); };
  var ce = console.error, cw = console.warn;
  console.error = function(){ errors.push('console.error: ' + str(arguments)); return ce.apply(console, arguments); };
  console.warn = function(){ warnings.push(str(arguments)); return cw.apply(console, arguments); };
  window.addEventListener('error', function(ev){
    var t = ev.target;
    errors.push(t && t !== window && (t.src || t.href) ? 'failed to load ' + (t.src || t.href)
                : 'uncaught: ' + ev.message + ' at ' + ev.filename + ':' + ev.lineno);
  }, true);
  window.addEventListener('unhandledrejection', function(ev){ errors.push('unhandled rejection: ' + ev.reason); });
  var done = false;
  var report = function(){
    if (done) return; done = true;
    var figs = Array.prototype.map.call(document.querySelectorAll('div.plotly-fig'), function(d){
      var r = d.getBoundingClientRect();
      return {id: d.id, state: d.getAttribute('data-state'), svgs: d.querySelectorAll('svg.main-svg').length,
              traces: d._fullData ? d._fullData.length : 0, trace_nodes: d.querySelectorAll('g.trace').length,
              points: d.querySelectorAll('.point').length,
              errorbars: d.querySelectorAll('g.errorbar').length,
              paths: Array.prototype.filter.call(d.querySelectorAll('.plot path'), function(p){
                       var a = p.getAttribute('d'); return a && a.length > 4; }).length,
              rect: [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]};
    });
    // the first sortable table: click its first numeric column twice; ascending, then descending?
    var sort = null, table = document.querySelector('table.sortable');
    if (table && table.tBodies[0].rows.length > 1) {
      var rows = function(){ return Array.prototype.slice.call(table.tBodies[0].rows); };
      var heads = table.querySelectorAll('th');
      for (var i = 0; i < heads.length && sort === null; i++) {
        var cells = rows().map(function(r){ return r.cells[i].getAttribute('data-v'); });
        if (cells.every(function(v){ return v !== null && v !== '' && !isNaN(Number(v)); })) {
          var vals = function(){ return rows().map(function(r){ return Number(r.cells[i].getAttribute('data-v')); }); };
          var sorted = function(a, dir){
            for (var k = 1; k < a.length; k++) if (dir * (a[k] - a[k-1]) < 0) return false;
            return true;
          };
          heads[i].click(); var up = sorted(vals(), 1);
          heads[i].click(); var down = sorted(vals(), -1);
          heads[i].click();  // back to ascending, as the page first showed it
          sort = {column: heads[i].textContent, ascending: up, descending: down};
        }
      }
    }
    var resources = performance.getEntriesByType('resource').map(function(e){ return e.name; })
                    .filter(function(n){ return !/^(file|data|blob|about):/.test(n); });
    // wide content: the page itself never scrolls sideways, every table sits in a wrapper that
    // scrolls (overflow-x auto), and nothing outside a wrapper reaches past the window
    var wrappers = Array.prototype.map.call(document.querySelectorAll('main table'), function(t){
      var w = t.parentElement;
      return {wrapped: w.classList.contains('scroll'), overflow_x: getComputedStyle(w).overflowX,
              scroll_width: w.scrollWidth, client_width: w.clientWidth};
    });
    var sticking = Array.prototype.filter.call(document.querySelectorAll('main *'), function(el){
      return !el.closest('div.scroll, pre, div.plotly-fig') && el.getBoundingClientRect().right > window.innerWidth + 1;
    }).map(function(el){ return el.tagName + '.' + el.className; });
    var overflow = {page_width: document.documentElement.scrollWidth, window_width: window.innerWidth,
                    tables: wrappers, sticking_out: sticking.slice(0, 10)};
    var el = document.createElement('script');
    el.type = 'application/json'; el.id = '__probe';
    el.textContent = JSON.stringify({errors: errors, warnings: warnings, figures: figs, resources: resources,
      drawn_ms: document.documentElement.getAttribute('data-drawn-ms'),
      plotly: typeof Plotly !== 'undefined' ? Plotly.version : null, title: document.title,
      sortable: document.querySelectorAll('table.sortable').length, sort: sort, overflow: overflow,
      page_height: document.documentElement.scrollHeight});
    document.body.appendChild(el);
  };
  var poll = function(){
    if (document.documentElement.getAttribute('data-drawn-ms')) { setTimeout(report, 200); return; }
    setTimeout(poll, 50);
  };
  window.addEventListener('load', function(){ poll(); setTimeout(report, 20000); });
})();
</script>
"""


def chromium_binary() -> str:
    """Debian's chromium (`make test` installs it); the browser tests fail without it, never skip."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "headless Chromium is required for the report browser tests and was not found: install "
        "Debian's `chromium` (apt-get install -y chromium; make test does as root)",
        pytrace=False,
    )


def _netns_prefix() -> list[str]:
    """`unshare -n` (no network namespace at all) where this user may create one; else []."""
    exe = shutil.which("unshare")
    if not exe:
        return []
    try:
        ok = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return [exe, "-n"] if ok else []


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) as an (h, w, c) uint8 array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, w = 8, [], 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            c = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * c)
    out = np.zeros((h, w * c), np.uint8)
    prev = np.zeros(w * c, np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, c), axis=0).reshape(-1) & 255
        elif f == 2:
            cur = (line + prev) & 255
        else:  # Average / Paeth depend on the byte to the left: plain Python over the row
            ln, up, res = line.tolist(), prev.tolist(), [0] * (w * c)
            for i in range(w * c):
                a = res[i - c] if i >= c else 0
                b = up[i]
                if f == 3:
                    res[i] = (ln[i] + ((a + b) >> 1)) & 255
                else:
                    ul = up[i - c] if i >= c else 0
                    pa, pb, pc = abs(b - ul), abs(a - ul), abs(a + b - 2 * ul)
                    res[i] = (ln[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else ul)) & 255
            cur = np.asarray(res, np.int32)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, c)[:, :, :3]


def render(page: Path, tmp: Path, *, width: int = 1280, height: int = 5200, scale: float = 0.5) -> SimpleNamespace:
    """Open `page` from file:// in headless Chromium with the network disabled, with PROBE_JS
    injected (into a copy next to it, so relative links are the same). Returns the probe's JSON,
    the console lines Chromium logged, the screenshot (as pixels, at `scale` device pixels per CSS
    pixel) and the scale."""
    exe = chromium_binary()
    text = page.read_text(encoding="utf-8")
    probe_page = page.with_name(page.stem + ".probe.html")
    probe_page.write_text(re.sub(r"<head>", lambda m: "<head>" + PROBE_JS, text, count=1), encoding="utf-8")
    shot = tmp / f"{page.stem}.png"
    profile = tmp / f"profile-{page.stem}"
    cmd = _netns_prefix() + [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        f"--force-device-scale-factor={scale}",
        "--virtual-time-budget=30000",
        f"--screenshot={shot}",
        "--dump-dom",
        probe_page.resolve().as_uri(),
    ]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        probe_page.unlink(missing_ok=True)
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'<script type="application/json" id="__probe">(.*?)</script>', p.stdout, re.S)
    assert m, f"the probe did not report (exit {p.returncode}); stderr tail:\n{p.stderr[-3000:]}"
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    assert shot.is_file(), f"no screenshot; stderr tail:\n{p.stderr[-3000:]}"
    return SimpleNamespace(
        probe=json.loads(m.group(1)),
        console=console,
        pixels=read_png(shot),
        screenshot=shot,
        scale=scale,
        stderr=p.stderr,
    )


@pytest.fixture(scope="session")
def browser():
    """browser.render(page, tmp, ...) -> what the page did in headless Chromium (see render)."""
    chromium_binary()
    return SimpleNamespace(render=render, read_png=read_png)


@pytest.fixture(scope="session")
def trials():
    """trials.write(run_dir, [(plan, predicted, measured), ...]) -> files written."""
    return SimpleNamespace(write=write_trials)
