"""Issue 24's hostile inputs, one regression test each (the calibration CSVs are in
test_calibration_csv.py): run-directory files of the wrong type or a special file, secrets in
storage URLs, a cluster that can never finish, contradictory prices, EP without MoE layers, an
absurd routing imbalance, fewer than one token, a missing AUTOPAR_LOCAL_PROFILE. Every one is one
line and exit 2, or works; `--json` output parses with a strict parser."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from autopar.spec.presets import get_preset
from autopar.spec.training_run import DEFAULT_CHECKPOINT_GBPS_PER_GPU, DEFAULT_INTERRUPTIONS_PER_GPU_HOUR

PW = "S3cr3tPW"


def strict_json(text: str):
    """json.loads refusing NaN and Infinity (what a strict parser does)."""

    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def tiny_run(cli_run, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tiny") / "run"
    r = cli_run("search", "--model", "tiny", "--gpus", "8", "--run-dir", run, "--json")
    assert r.returncode == 0, r.stderr
    return run


def _copy(run: Path, tmp_path: Path, name: str, change) -> Path:
    """A copy of the run whose JSON file `name` is changed by change(data) (returning the new data)."""
    out = tmp_path / "run"
    shutil.copytree(run, out)
    data = json.loads((out / name).read_text())
    (out / name).write_text(json.dumps(change(data)))
    return out


def _plan_is(value):
    def change(top):
        top["top"][0]["plan"] = value
        return top

    return change


def _question_field(key, value):
    def change(search):
        if key is None:
            search["question"] = value
        else:
            search["question"][key] = value
        return search

    return change


def _commands(run: Path, tmp_path: Path) -> dict[str, list]:
    return {
        "export": ["export", "--to", "megatron", "--run", run, "--out", tmp_path / "x"],
        "compare": ["compare", run, "--tp 1", "--out", tmp_path / "c.html"],
        "report": ["report", run, "--out", tmp_path / "r.html"],
    }


@pytest.mark.parametrize(
    "name, change, where, shown",
    [
        ("top.json", _plan_is(None), "top[0].plan", "is null"),
        ("top.json", _plan_is("dp8"), "top[0].plan", "is a string 'dp8'"),
        ("search.json", _question_field("cluster", None), "question.cluster", "is null"),
        ("search.json", _question_field("cluster", "h100-sxm"), "question.cluster", "is a string"),
        ("search.json", _question_field("model", None), "question.model", "is null"),
        ("search.json", _question_field("model", "tiny"), "question.model", "is a string"),
        ("search.json", _question_field(None, [1]), "question", "is a list"),
    ],
)
@pytest.mark.parametrize("command", ["export", "compare", "report"])
def test_a_run_file_of_the_wrong_type_is_one_line(
    cli_run, one_line_error, tiny_run, tmp_path, name, change, where, shown, command
):
    run = _copy(tiny_run, tmp_path, name, change)
    line = one_line_error(
        cli_run(*_commands(run, tmp_path)[command]),
        ["corrupt run directory", f"{name} {where} {shown}", "rerun `autopar search`"],
    )
    assert "expected an object" in line
    assert not (tmp_path / "x").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.timeout(60)  # a hang fails the test instead of the suite
@pytest.mark.parametrize("target", ["fifo", "/dev/urandom", "/dev/zero"])
@pytest.mark.parametrize("name", ["top.json", "search.json"])
@pytest.mark.parametrize("command", ["export", "compare", "report"])
def test_a_special_run_file_is_refused_at_once(cli_run, one_line_error, tiny_run, tmp_path, target, name, command):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / name).unlink()
    if target == "fifo":
        os.mkfifo(run / name)
    else:
        (run / name).symlink_to(target)
    one_line_error(cli_run(*_commands(run, tmp_path)[command]), [name, "not a regular file"])


@pytest.mark.timeout(60)
def test_a_special_trial_file_is_skipped_by_the_report(cli_run, tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "trials").mkdir()
    os.mkfifo(run / "trials" / "fifo.json")
    (run / "trials" / "null-plan.json").write_text(json.dumps({"plan": None, "predicted": {}, "measured": {}}))
    r = cli_run("report", run, "--out", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    assert "trials/fifo.json is a FIFO" in page and "trials/null-plan.json: plan is null" in page


@pytest.mark.parametrize(
    "plan_file, words",
    [
        ({"plan": {"layout": ["a"]}}, ["plan.layout[0] is a string 'a'"]),
        ({"plan": {"tp": 10**22}}, ["plan.tp is 10000000000000000000000", "at most"]),
        ({"plan": {}, "model": 5}, ["model is 5", "a string or an object"]),
        ({"plan": {}, "model": "tiny", "num_gpus": "x"}, ["num_gpus is a string 'x'"]),
        ({"model": "tiny"}, ["plan is missing"]),
    ],
)
def test_a_plan_file_of_the_wrong_type_is_one_line(cli_run, one_line_error, tiny_run, tmp_path, plan_file, words):
    """compare's plan files go through the same schema (autopar.search.run_schema.PlanFile)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_file))
    one_line_error(cli_run("compare", path, tiny_run), ["plan file", *words])


def test_calibrate_leaves_out_a_trial_document_of_the_wrong_type(cli_run, one_line_error, tiny_run, tmp_path):
    """A trial whose plan is not a plan, or whose measured figures are not numbers, is not fitted."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "trials").mkdir()
    plan = json.loads((run / "top.json").read_text())["top"][0]["plan"]
    docs = {
        "a": {"plan": {"tp": "x"}, "measured": {"step_time_s": 1.0, "peak_memory_bytes": 1e9}},
        "b": {"plan": plan, "measured": {"step_time_s": "x", "peak_memory_bytes": None}},
        "c": {"plan": plan, "measured": {"step_time_s": 1.0, "peak_memory_bytes": 1e400}},
    }
    for key, doc in docs.items():
        doc |= {"key": key, "status": "ok", "predicted": {"step_time_s": 1.0}}
        (run / "trials" / f"{key}.json").write_text(json.dumps(doc))
    one_line_error(cli_run("calibrate", run), ["fewer than 2 successful trials"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_special_storage_file_is_refused_at_once(cli_run, one_line_error, tmp_path, target, kind):
    """An Optuna journal or SQLite file that is a FIFO (an open for writing blocks) or a device (read
    for ever) is refused before the search; nothing is left behind."""
    path = tmp_path / ("j.log" if kind == "journal" else "s.db")
    if target == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    storage = str(path) if kind == "journal" else f"sqlite:///{path}"
    argv = ["search", "--model", "tiny", "--gpus", "8", "--max-exhaustive", "0", "--n-trials", "3"]
    one_line_error(cli_run(*argv, "--storage", storage, "--run-dir", tmp_path / "run"), ["not a regular file"])
    assert not (tmp_path / "run").exists()


# ---- secrets --------------------------------------------------------------------------------------


def _leaks(folder: Path, *streams: str) -> list[str]:
    where = [f"stream {i}" for i, s in enumerate(streams) if PW in s]
    if folder.exists():
        where += [str(p) for p in folder.rglob("*") if p.is_file() and PW.encode() in p.read_bytes()]
    return where


@pytest.mark.parametrize(
    "storage, shown",
    [
        (f"postgresql://u@127.0.0.1:1/db?sslpassword={PW}", "sslpassword=***"),
        (f"postgresql:/u:{PW}@127.0.0.1:1/db", "postgresql:/u:***@"),  # a mistyped scheme
    ],
)
def test_a_storage_that_fails_to_open_shows_no_password(cli_run, one_line_error, tmp_path, storage, shown):
    run = tmp_path / "run"
    optuna = ["--max-exhaustive", "0", "--n-trials", "3"]
    r = cli_run("search", "--model", "tiny", "--gpus", "4", "--storage", storage, *optuna, "--run-dir", run)
    one_line_error(r, ["cannot open storage", shown], absent=[PW])
    assert not _leaks(run, r.stdout, r.stderr)


def test_a_query_password_is_not_written_into_search_json(cli_run, tmp_path):
    run = tmp_path / "run"
    storage = f"sqlite:///pw.db?sslpassword={PW}"
    r = cli_run("search", "--model", "tiny", "--gpus", "4", "--storage", storage, "--run-dir", run, "--json")
    assert r.returncode == 0, r.stderr
    assert strict_json((run / "search.json").read_text())["options"]["storage"] == "sqlite:///pw.db?sslpassword=***"
    assert not _leaks(run, r.stdout, r.stderr)


# ---- a cluster that can never finish; no infinity leaves autopar ---------------------------------


def _cluster(tmp_path: Path, **reliability) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"gpu": "h100-sxm", "reliability": reliability}))
    return path


def test_an_mtbf_shorter_than_a_checkpoint_write_is_refused(cli_run, one_line_error, tmp_path):
    """One interruption per GPU-hour on 256 GPUs: MTBF 3600 / 256 = 14.1 s. A 70B checkpoint is 14
    bytes per parameter (bf16 weights, fp32 master, Adam m and v) written at 2 TB/s / 16,384 GPUs per
    GPU: P x 14 / (0.122 GB/s x 256) = 31.6 s."""
    write = get_preset("70b").params_total * 14 / (DEFAULT_CHECKPOINT_GBPS_PER_GPU * 1e9 * 256)
    assert f"{write:.3g}" == "31.6"
    cluster = _cluster(tmp_path, interruptions_per_gpu_hour=1.0)
    words = ["MTBF 14.1 s", "shorter than one checkpoint write, 31.6 s", "never finish", "reliability"]
    estimate = ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--cluster", cluster]
    one_line_error(cli_run(*estimate, "--tokens", "15T"), words)
    search = ["search", "--model", "70b", "--gpus", "256", "--cluster", cluster, "--run-dir", tmp_path / "run"]
    one_line_error(cli_run(*search, "--tokens", "15T"), words)
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_one_week_restart_longer_than_the_mtbf_is_refused(cli_run, one_line_error, tmp_path):
    """The default rate (Llama 3: 419 interruptions in 54 days on 16,384 GPUs) on 2,048 GPUs: MTBF
    54 x 24 h x 16,384 / (419 x 2,048) = 24.7 h, shorter than a restart of one week."""
    mtbf_h = 1 / (DEFAULT_INTERRUPTIONS_PER_GPU_HOUR * 2048)
    assert f"{mtbf_h:.3g}" == "24.7" and mtbf_h == pytest.approx(54 * 24 * 16384 / (419 * 2048))
    cluster = _cluster(tmp_path, restart_s=7 * 86_400)
    argv = ["search", "--model", "70b", "--gpus", "2048", "--cluster", cluster, "--tokens", "15T"]
    one_line_error(cli_run(*argv, "--run-dir", tmp_path / "run"), ["MTBF 24.7 h", "restart (7.0 days)", "never"])


def test_a_cluster_never_interrupted_writes_null_with_a_reason(cli_run, tmp_path):
    cluster = _cluster(tmp_path, interruptions_per_gpu_hour=0)
    argv = ["estimate", "--model", "tiny", "--gpus", "8", "--cluster", cluster, "--tokens", "1T"]
    r = cli_run(*argv, "--json")
    assert r.returncode == 0, r.stderr
    run = strict_json(r.stdout)["run"]
    assert run["mtbf_s"] is None and run["interval_s"] is None and run["goodput"] == 1.0
    assert (
        set(run["why_null"]) == {"mtbf_s", "interval_s"}
        and "interruptions_per_gpu_hour is 0" in run["why_null"]["mtbf_s"]
    )
    table = cli_run(*argv).stdout
    assert "inf" not in table and table.count("never") == 2  # MTBF and checkpoint interval
    search = ["search", "--model", "tiny", "--gpus", "8", "--cluster", cluster, "--tokens", "1T"]
    r = cli_run(*search, "--price-per-gpu-hour", "2", "--run-dir", tmp_path / "run", "--json")
    assert r.returncode == 0, r.stderr
    strict_json(r.stdout)
    for name in ("top.json", "search.json"):
        strict_json((tmp_path / "run" / name).read_text())
    run = strict_json((tmp_path / "run" / "top.json").read_text())["top"][0]["run"]
    assert run["checkpoint_interval_min"] is None and "never interrupted" in run["why_null"]["checkpoint_interval_min"]


def test_a_search_without_a_price_writes_strict_json(cli_run, tmp_path):
    """The cost of plans that are not priced is null, not NaN."""
    r = cli_run("search", "--model", "tiny", "--gpus", "8", "--tokens", "1T", "--run-dir", tmp_path / "run", "--json")
    assert r.returncode == 0, r.stderr
    top = strict_json((tmp_path / "run" / "top.json").read_text())
    run = top["top"][0]["run"]
    assert (
        run["cost"] is None and run["days"] > 0 and run["why_null"] == {"cost": "not priced: give --price-per-gpu-hour"}
    )


# ---- contradictions ----------------------------------------------------------------------------

ESTIMATE = ["estimate", "--model", "70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--tokens", "15T"]


@pytest.mark.parametrize(
    "prices, words",
    [
        ("h100-sxm=2,h100-sxm=3", ["prices h100-sxm twice"]),
        ("h100=2,h100-sxm=3", ["prices h100-sxm twice", "'h100' and 'h100-sxm'"]),
        ("h100-sx=2,h100-sxm=3", ["'h100-sx'", "no GPU preset", "did you mean 'h100-sxm'"]),
    ],
)
def test_contradictory_prices_are_one_line(cli_run, one_line_error, prices, words):
    one_line_error(cli_run(*ESTIMATE, "--price-per-gpu-hour", prices), ["--price-per-gpu-hour", *words])


def test_a_custom_gpu_is_priced_by_its_name(cli_run, one_line_error, tmp_path):
    """A cluster file's `gpu: {base: h100-sxm, name: mygpu}` is priced as mygpu: 3 per GPU-hour x
    the GPU-hours the same plan takes on an h100-sxm."""
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"gpu": {"base": "h100-sxm", "name": "mygpu"}}))
    mine = cli_run(*ESTIMATE, "--cluster", path, "--price-per-gpu-hour", "mygpu=3", "--json")
    assert mine.returncode == 0, mine.stderr
    run = strict_json(mine.stdout)["run"]
    assert run["cost"] == pytest.approx(3 * run["gpu_hours"])
    one_line_error(
        cli_run(*ESTIMATE, "--cluster", path, "--price-per-gpu-hour", "mygpu=3,h100-sxm=2"), ["'mygpu' twice"]
    )
    line = one_line_error(
        cli_run(*ESTIMATE, "--cluster", path, "--price-per-gpu-hour", "b200=3"), ["no price for 'mygpu'"]
    )
    assert "describe it in a --cluster" not in line
    # the other way round: a cluster file's name without the cluster file is no GPU of the question
    words = ["'mygpu'", "no GPU of this question (h100-sxm)"]
    one_line_error(cli_run(*ESTIMATE, "--price-per-gpu-hour", "mygpu=3"), words)


def test_ep_without_moe_layers_is_one_line(cli_run, one_line_error, tmp_path):
    """A MoE model whose first_k_dense dense layers cover all its layers has no MoE layer."""
    moe = dict(num_experts=4, top_k=2, expert_ffn_hidden_size=64, first_k_dense=4)
    model = dict(num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=2, moe=moe)
    model |= dict(head_dim=16, vocab_size=1000, seq_len=256)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(model))
    one_line_error(cli_run("estimate", "--model", path, "--gpus", "2", "--ep", "2"), ["ep=2", "first_k_dense 4"])


@pytest.mark.parametrize(
    "argv, value, words",
    [
        (["--model", "tiny", "--gpus", "8"], "1e308", ["above ep=1", "from 1 to 1"]),
        (["--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "4"], "4.5", ["above ep=4", "from 1 to 4"]),
    ],
)
def test_a_routing_imbalance_above_ep_is_one_line(cli_run, one_line_error, argv, value, words):
    """The busiest of ep ranks holds at most every token: ep x the mean."""
    one_line_error(cli_run("estimate", *argv, "--routing-imbalance", value), ["--routing-imbalance", *words])


def test_fewer_than_one_token_is_one_line(cli_run, one_line_error):
    one_line_error(
        cli_run("estimate", "--model", "tiny", "--gpus", "8", "--tokens", "1e-9"), ["--tokens", "fewer than one"]
    )


def test_a_missing_local_profile_is_one_line(cli_run, one_line_error, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a short path: the error line quotes it whole
    monkeypatch.setenv("AUTOPAR_LOCAL_PROFILE", "typo.yaml")
    one_line_error(
        cli_run("estimate", "--model", "tiny", "--gpus", "2", "--gpu", "local"),
        ["AUTOPAR_LOCAL_PROFILE", "typo.yaml", "does not exist", "autopar probe"],
    )


@pytest.mark.parametrize(
    "text, key, line, first",
    [
        ("knobs:\n  tp: [1, 2]\n  pp: [1]\n  tp: [4]\n", "tp", 4, 2),  # a knob repeated in its section
        ("knobs:\n  tp: [1, 2]\nknobs:\n  pp: [2]\n", "knobs", 3, 1),  # a whole section repeated
        ("name: a\nname: b\nknobs:\n  tp: [1]\n", "name", 2, 1),
    ],
)
def test_a_repeated_key_in_a_space_file_is_refused_with_its_line(
    cli_run, one_line_error, tmp_path, text, key, line, first
):
    """PyYAML keeps the last of a repeated key silently: a space file's second entry would win
    unnoticed. Refused in one line that names the key and both lines."""
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    r = cli_run("search", "--model", "8b", "--gpus", "8", "--space", path)
    one_line_error(r, (f"repeats the key '{key}'", f"line {line}", f"first on line {first}"))


def test_merge_keys_may_repeat_what_they_merge(tmp_path):
    """`<<: *base` then a key of the base: a merge, not a repeat."""
    from autopar.spec.yaml_io import parse_yaml

    data = parse_yaml("base: &b\n  tp: [1]\n  pp: [1]\nknobs:\n  <<: *b\n  tp: [2]\n", "space")
    assert data["knobs"] == {"tp": [2], "pp": [1]}


@pytest.mark.parametrize(
    "column, corrupt, needle",
    [
        ("fits", lambda s: s.astype(str), "column 'fits'"),  # the expected columns with the wrong types
        ("step_time_s", lambda s: s.astype(str), "column 'step_time_s'"),
        ("tp", lambda s: s.astype(float).astype(str), "column 'tp'"),
        ("plan_name", lambda s: s.str.len(), "column 'plan_name'"),
        ("step_time_s", lambda s: s * float("nan"), "no step time"),  # every figure missing
    ],
)
def test_a_scatter_of_the_wrong_types_is_one_line(cli_run, one_line_error, tiny_run, tmp_path, column, corrupt, needle):
    import shutil

    import pandas as pd

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    df = pd.read_parquet(run / "scatter.parquet")
    df[column] = corrupt(df[column])
    df.to_parquet(run / "scatter.parquet", index=False)
    one_line_error(cli_run("report", run), ("scatter.parquet", needle))


def _first_top(data, **changes):
    data["top"][0].update(changes)
    return data


@pytest.mark.parametrize(
    "name, change, needle",
    [
        ("top.json", lambda d: _first_top(d, step_time_s=float("nan")), "top[0].step_time_s"),
        ("top.json", lambda d: _first_top(d, step_time_s=-1.0), "top[0].step_time_s"),
        ("top.json", lambda d: _first_top(d, step_time_s_interval="1-2"), "top[0].step_time_s_interval"),
        ("top.json", lambda d: _first_top(d, step_time_s_interval=[1.0]), "top[0].step_time_s_interval"),
        ("top.json", lambda d: _first_top(d, interval_level=80), "top[0].interval_level"),
        ("top.json", lambda d: _first_top(d, support={"kind": "calibrated"}), "top[0].support"),
        ("top.json", lambda d: _first_top(d, support="trust me"), "top[0].support"),
        ("search.json", lambda d: {**d, "sureness": {"a": 1}}, "sureness"),
        ("search.json", lambda d: {**d, "question": {**d["question"], "rank_by": "p95"}}, "question.rank_by"),
    ],
)
def test_a_run_file_with_values_its_schema_forbids_is_one_line(
    cli_run, one_line_error, tiny_run, tmp_path, name, change, needle
):
    """NaN or negative figures, an interval that is not two numbers, a level of 80 (not 0.8), a
    support or sureness of the wrong kind, an unknown rank_by: every reader refuses the file in one
    line naming it, the field and the fix."""
    run = _copy(tiny_run, tmp_path, name, change)
    for args in (("report", run), ("export", "--run", run, "--rank", "1", "--to", "megatron", "--out", tmp_path / "x")):
        one_line_error(cli_run(*args), (name, needle))
