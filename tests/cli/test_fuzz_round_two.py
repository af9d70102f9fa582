"""Property tests (hypothesis) over issue 24's surfaces: calibration CSV rows (`validate --runs`),
the run directory's JSON files (top.json, search.json, trials/*.json under export, compare, report),
a cluster file's reliability mapping and the price lists (`--tokens ... --price-per-gpu-hour`).

The property: exit 0, or exactly one stderr line `autopar: error: ...` and exit 2; never a
traceback (an exception escaping main fails the test), never a hang (pytest-timeout), `--json`
output that a strict parser reads (no NaN, no Infinity), and no secret on any stream or in any
file written. Bounded: derandomized, a few dozen examples each, about a minute in this process.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.calibration.run_rows import bundled_runs

#: a numpy overflow or division warning is a failure too (the user would see it on stderr)
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

PW = "S3cr3tPW"
#: values that carry a password: whatever autopar writes must not show it
SECRETS = [f"postgresql://u:{PW}@h/db", f"sqlite:///x.db?sslpassword={PW}", f"postgres:/u:{PW}@h", f"a?api_key={PW}"]

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: text of any kind but the bare password (hypothesis draws the module's constants too): a password is
#: a secret inside the forms of SECRETS, not on its own
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30).filter(
    lambda t: PW not in t
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**7),
    st.integers(min_value=10**15, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT, st.sampled_from(SECRETS))
JUNK = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(TEXT, children, max_size=3)),
    max_leaves=8,
)


def strict_json(text: str):
    def refuse(word: str):
        raise ValueError(f"{word} is not strict JSON")

    return json.loads(text, parse_constant=refuse)


def check(r, one_line_error, *, as_json: bool = False, written: Path | None = None) -> None:
    """The property (module docstring) for one run of the CLI."""
    if r.returncode != 0:
        one_line_error(r)
    elif as_json:
        strict_json(r.stdout)
    assert PW not in r.stderr and (PW not in r.stdout if as_json else True)
    if written is not None and written.exists():
        leaks = [p for p in written.rglob("*") if p.is_file() and PW.encode() in p.read_bytes()]
        assert not leaks, leaks


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz2")


# ---- calibration CSV rows -------------------------------------------------------------------------

ROWS = [r for r in bundled_runs() if r["row_id"] in ("1", "2", "3")]
COLUMNS = list(ROWS[0])
CELL = st.one_of(
    NUMBERS.map(str),
    TEXT,
    st.sampled_from(["0", "-1", "1e400", "nan", "inf", "500%", "1,000", "1.2.3", "", "  ", "2.5", *SECRETS]),
)


@settings(max_examples=40, **SETTINGS)
@given(changes=st.lists(st.tuples(st.sampled_from(COLUMNS), CELL), min_size=1, max_size=4), bom=st.booleans())
@pytest.mark.timeout(300)
def test_a_calibration_row_is_exit_0_or_one_line(cli_run, one_line_error, scratch, changes, bom):
    row = dict(ROWS[0])
    row.update(changes)
    path = scratch / "runs.csv"
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows([row, *ROWS[1:]])
    r = cli_run("validate", "--runs", path, "--json")
    check(r, one_line_error, as_json=True)
    if r.returncode == 0:  # the good rows are evaluated whatever the bad one holds
        out = strict_json(r.stdout)
        assert {"2", "3"} <= {x["row_id"] for x in out["rows"]}


@settings(max_examples=25, **SETTINGS)
@given(text=st.text(max_size=400).filter(lambda t: PW not in t))
@pytest.mark.timeout(300)
def test_any_text_as_a_calibration_csv_is_exit_0_or_one_line(cli_run, one_line_error, scratch, text):
    path = scratch / "raw.csv"
    path.write_text(text, errors="surrogatepass")
    check(cli_run("validate", "--runs", path, "--json"), one_line_error, as_json=True)


# ---- the run directory's JSON files ---------------------------------------------------------------


@pytest.fixture(scope="module")
def priced_run(cli_run, tmp_path_factory) -> Path:
    """A finished search of the tiny model with its whole run priced, and one trial document."""
    run = tmp_path_factory.mktemp("priced") / "run"
    argv = ["search", "--model", "tiny", "--gpus", "8", "--top-k", "3", "--tokens", "1T", "--deadline", "1000d"]
    r = cli_run(*argv, "--price-per-gpu-hour", "2", "--budget", "1M", "--run-dir", run, "--json")
    assert r.returncode == 0, r.stderr
    top = json.loads((run / "top.json").read_text())
    (run / "trials").mkdir()
    doc = {"key": "k1", "plan": top["top"][0]["plan"], "status": "ok", "kind": "full", "reasons": []}
    doc |= {"predicted": {"step_time_s": 1.0, "peak_memory_bytes": 2e9}}
    doc |= {"measured": {"step_time_s": 1.1, "peak_memory_bytes": 2.1e9, "step_times_s": [1.1, 1.1]}}
    (run / "trials" / "k1.json").write_text(json.dumps(doc))
    return run


#: file -> the paths of its fields that readers use (dotted; [0] the first item of a list)
FIELDS = {
    "top.json": [
        "why",
        "top",
        "top[0]",
        "top[0].plan",
        "top[0].plan_name",
        "top[0].plan_index",
        "top[0].trainer",
        "top[0].trainers",
        "top[0].step_time_s",
        "top[0].run",
        "top[0].run.days",
    ]
    + [
        f"top[0].plan.{k}"
        for k in (
            "tp",
            "pp",
            "dp",
            "ep",
            "vpp",
            "layout",
            "trainer",
            "dtype",
            "recompute",
            "micro_batch_size",
            "global_batch_size",
            "capacity_factor",
            "sequence_parallel",
        )
    ],
    "search.json": [
        "schema_version",
        "autopar_version",
        "question",
        "question.model",
        "question.model.name",
        "question.model.num_layers",
        "question.model.hidden_size",
        "question.model.moe",
        "question.cluster",
        "question.cluster.gpu",
        "question.cluster.gpus_per_node",
        "question.cluster.intra_node_gbps",
        "question.cluster.constants",
        "question.cluster.reliability",
        "question.num_gpus",
        "question.seq_len",
        "question.global_batch_size",
        "question.trainers",
        "space",
        "space.name",
        "space.knobs",
        "space.knobs.tp",
        "space.constraints",
        "space.constraints.memory_headroom_gib",
        "options",
        "options.top_k",
        "options.training",
        "options.training.tokens",
        "options.training.deadline_s",
        "options.training.price_per_gpu_hour",
        "options.training.prices_by_gpu",
        "options.training.budget",
        "method",
        "plans_evaluated",
        "plans_valid",
        "plans_fit",
        "rejected_by",
        "why",
        "timings_s",
        "timings_s.total_s",
        "history",
    ],
    "trials/k1.json": [
        "plan",
        "predicted",
        "measured",
        "status",
        "kind",
        "reasons",
        "proxy",
        "key",
        "predicted.step_time_s",
        "measured.step_time_s",
        "measured.peak_memory_bytes",
        "plan.tp",
    ],
}
DELETE = object()


def _set(data, path: str, value):
    """`data` with the field at `path` set to `value` (DELETE: removed); a path that does not lead
    anywhere leaves it as it is."""
    *heads, last = path.replace("[0]", ".0").split(".")
    node = data
    for h in heads:
        if h.isdigit() and isinstance(node, list) and node:
            node = node[int(h)]
        elif isinstance(node, dict) and not h.isdigit():
            node = node.get(h)
        else:
            return data
    key = int(last) if last.isdigit() else last
    if isinstance(node, list) and isinstance(key, int) and node:
        node[key] = value if value is not DELETE else node[key]
    elif isinstance(node, dict):
        if value is DELETE:
            node.pop(key, None)
        else:
            node[key] = value
    return data


FILE_FIELDS = [(name, f) for name, fields in FIELDS.items() for f in fields]


@settings(max_examples=60, **SETTINGS)
@given(
    field=st.sampled_from(FILE_FIELDS),
    value=st.one_of(JUNK, st.just(DELETE)),
    command=st.sampled_from(["export", "compare", "report"]),
)
@pytest.mark.timeout(600)
def test_a_run_file_field_is_exit_0_or_one_line(cli_run, one_line_error, scratch, priced_run, field, value, command):
    name, path = field
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(priced_run, run)
    data = json.loads((run / name).read_text())
    (run / name).write_text(json.dumps(_set(data, path, value)))
    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = {
        "export": ["export", "--to", "megatron", "--run", run, "--out", out / "x"],
        "compare": ["compare", run, "--tp 1", "--out", out / "c.html", "--json"],
        "report": ["report", run, "--out", out / "r.html"],
    }[command]
    check(cli_run(*argv), one_line_error, as_json=command == "compare", written=out)


# ---- the reliability mapping and the price lists ---------------------------------------------------

RELIABILITY = st.fixed_dictionaries(
    {},
    optional={
        "interruptions_per_gpu_hour": st.one_of(st.floats(0, 1), st.sampled_from([0, 1e-300, 1.0]), JUNK),
        "checkpoint_gbps_per_gpu": st.one_of(st.floats(1e-6, 1e4), st.sampled_from([1e-300, 1e4]), JUNK),
        "restart_s": st.one_of(st.floats(0, 7 * 86_400), st.sampled_from([0, 7 * 86_400]), JUNK),
    },
)


@settings(max_examples=60, **SETTINGS)
@given(rel=RELIABILITY, gpus=st.sampled_from(["8", "256", "16384"]), command=st.sampled_from(["estimate", "search"]))
@pytest.mark.timeout(600)
def test_a_reliability_mapping_is_exit_0_or_one_line(cli_run, one_line_error, scratch, rel, gpus, command):
    path = scratch / "rel.yaml"
    path.write_text(yaml.safe_dump({"gpu": "h100-sxm", "reliability": rel}, allow_unicode=True))
    run = scratch / "relrun"
    shutil.rmtree(run, ignore_errors=True)
    argv = [command, "--model", "tiny", "--gpus", gpus, "--cluster", path, "--tokens", "15T", "--json"]
    extra = ["--price-per-gpu-hour", "2"] + (["--run-dir", run, "--top-k", "2"] if command == "search" else [])
    check(cli_run(*argv, *extra), one_line_error, as_json=True, written=run)
    for name in ("top.json", "search.json"):
        if (run / name).exists():
            strict_json((run / name).read_text())


KINDS = st.sampled_from(["h100-sxm", "h100", "H100", "b200", "mygpu", "MyGPU", "h100-sx", "", " ", "=", *SECRETS])
PRICE = st.one_of(
    st.sampled_from(["2", "2.5", "0", "-1", "1e400", "nan", "1e6", "1e7", "3k", "", "x"]), NUMBERS.map(str)
)
PAIR = st.one_of(PRICE, st.tuples(KINDS, PRICE).map(lambda kp: f"{kp[0]}={kp[1]}"))


@settings(max_examples=60, **SETTINGS)
@given(pairs=st.lists(PAIR, min_size=1, max_size=4), custom=st.booleans())
@pytest.mark.timeout(300)
def test_a_price_list_is_exit_0_or_one_line(cli_run, one_line_error, scratch, pairs, custom):
    """Prices for a preset GPU, or for a cluster file's GPU named mygpu on an h100-sxm base."""
    argv = ["estimate", "--model", "tiny", "--gpus", "8", "--tokens", "1T", "--json"]
    if custom:
        path = scratch / "mygpu.yaml"
        path.write_text(yaml.safe_dump({"gpu": {"base": "h100-sxm", "name": "mygpu"}}))
        argv += ["--cluster", path]
    r = cli_run(*argv, "--price-per-gpu-hour", ",".join(pairs))
    check(r, one_line_error, as_json=True)
    if r.returncode == 0:  # priced with the GPU's own price (by its preset or its name), else the bare one
        run = strict_json(r.stdout)["run"]
        t = run["training_run"]
        names = {"h100-sxm", "mygpu" if custom else "nvidia h100 sxm5 80gb"}
        price = next((v for k, v in t["prices_by_gpu"].items() if k in names), t["price_per_gpu_hour"])
        assert run["cost"] == pytest.approx(run["gpu_hours"] * price)


# ---- compare's plan files -----------------------------------------------------------------------

PLAN_FIELDS = ["plan", "model", "num_gpus", "gpu", "seq_len", "question"] + [
    f"plan.{k}" for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "layout", "zero_stage", "trainer", "dtype",
                          "recompute", "recompute_layers", "micro_batch_size", "global_batch_size", "pp_schedule",
                          "capacity_factor", "moe_dispatch")
]  # fmt: skip


@pytest.fixture(scope="module")
def plan_file(cli_run, tmp_path_factory) -> dict:
    """`autopar estimate --json` of a tiny plan: a plan file compare reads."""
    r = cli_run("estimate", "--model", "tiny", "--gpus", "8", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@settings(max_examples=40, **SETTINGS)
@given(field=st.sampled_from(PLAN_FIELDS), value=st.one_of(JUNK, st.just(DELETE)))
@pytest.mark.timeout(300)
def test_a_plan_file_field_is_exit_0_or_one_line(cli_run, one_line_error, scratch, plan_file, field, value):
    path = scratch / "plan.json"
    path.write_text(json.dumps(_set(json.loads(json.dumps(plan_file)), field, value)))
    out = scratch / "cmp"
    shutil.rmtree(out, ignore_errors=True)
    check(
        cli_run("compare", path, "--tp 1", "--out", out / "c.html", "--json"), one_line_error, as_json=True, written=out
    )
