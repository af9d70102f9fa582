"""Benchmark of the HTML report: what writing it adds to `autopar search --model 70b --gpus 256`
(whole process, with and without the report), the report's size, and how fast it opens in headless
Chromium from file:// (median of several loads):

- first paint: the page's text (question, answer, top-k table) is on screen;
- first screen drawn: every figure in the first 1400x900 screen has drawn (`data-plotted-ms`);
- all drawn: every figure of the page has drawn (`data-drawn-ms`).

Prints figures; asserts nothing. Needs Debian's chromium for the open times.

Run: .venv/bin/python benchmarks/bench_report.py [--repeats N]
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--model", "70b", "--gpus", "256"]
# `autopar search` followed by the report, as the proposed cli/search.py line does it
WITH_REPORT = (
    "import sys; from autopar.cli import main; main(sys.argv[1:]); "
    "from autopar.report import write_reports; write_reports([sys.argv[-1]])"
)

PROBE = """<script>
window.addEventListener('load', function(){
  var poll = function(){
    var root = document.documentElement;
    if (!root.getAttribute('data-drawn-ms')) { setTimeout(poll, 20); return; }
    var fcp = performance.getEntriesByName('first-contentful-paint')[0];
    root.setAttribute('data-fcp-ms', fcp ? String(Math.round(fcp.startTime)) : '');
  };
  poll();
});
</script>"""


def search_walls(repeats: int) -> tuple[list[float], list[float]]:
    plain, with_report = [], []
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "autopar", *SEARCH, "--run-dir", d],
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=REPO,
            )
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", WITH_REPORT, *SEARCH, "--run-dir", d],
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=REPO,
            )
            with_report.append(time.perf_counter() - t)
    return plain, with_report


def in_process(run_dir: Path, repeats: int) -> list[float]:
    from autopar.report.html import write_report

    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        write_report(run_dir)
        out.append(time.perf_counter() - t)
    return out


def open_times(page: Path, repeats: int) -> list[dict]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("open time: chromium not found (apt-get install -y chromium)")
        return []
    probe = page.with_name("report.bench.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
    rows = []
    try:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as profile:
                t = time.perf_counter()
                p = subprocess.run(
                    [
                        exe,
                        "--headless",
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-quic",
                        "--no-first-run",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-dev-shm-usage",
                        "--disable-sync",
                        f"--user-data-dir={profile}",
                        "--window-size=1400,900",
                        "--virtual-time-budget=20000",
                        "--dump-dom",
                        probe.resolve().as_uri(),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                wall = time.perf_counter() - t
            attrs = dict(re.findall(r'data-([a-z]+)-ms="(\d*)"', p.stdout[:2000]))
            rows.append(
                {
                    "fcp": float(attrs.get("fcp") or "nan"),
                    "plotted": float(attrs.get("plotted", "nan")),
                    "drawn": float(attrs.get("drawn", "nan")),
                    "process": wall,
                }
            )
    finally:
        probe.unlink(missing_ok=True)
    return rows


def main() -> None:
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 5
    plain, with_report = search_walls(repeats)
    med = statistics.median
    print(
        f"autopar search --model 70b --gpus 256 (whole process, median of {repeats}): {med(plain):.2f} s; "
        f"with the report: {med(with_report):.2f} s; added {med(with_report) - med(plain):+.2f} s "
        f"(min {min(plain):.2f} / {min(with_report):.2f})"
    )
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(
            [sys.executable, "-m", "autopar", *SEARCH, "--run-dir", d], check=True, stdout=subprocess.DEVNULL, cwd=REPO
        )
        ip = in_process(Path(d), repeats)
        print(
            f"write_report in process (after the first, imports warm): median {med(ip[1:] or ip):.3f} s; "
            f"first call {ip[0]:.3f} s"
        )
        page = Path(d) / "report.html"
        print(f"report size: {page.stat().st_size / 1e6:.2f} MB (plotly.js inlined once)")
        rows = open_times(page, repeats)
        if rows:
            col = lambda k: [r[k] for r in rows]  # noqa: E731
            print(
                f"open in headless Chromium from file://, 1400x900 window (median of {len(rows)}): first paint "
                f"{med(col('fcp')):.0f} ms, first screen drawn {med(col('plotted')):.0f} ms, every figure drawn "
                f"{med(col('drawn')):.0f} ms (ms since navigation start); whole browser process incl. start-up "
                f"{med(col('process')):.1f} s"
            )


if __name__ == "__main__":
    main()
