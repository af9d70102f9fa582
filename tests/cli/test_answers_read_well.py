"""Answers a person can read (issue 26, section 4): the 8b alias, too few --tokens, figures without
e-notation, exit 1 for an unmet deadline or budget (tests/cli/test_training_run.py), export to a comma
list, a missing AUTOPAR_LOCAL_PROFILE, and a default global batch that adapts to the GPUs."""

from __future__ import annotations

import json

from autopar.report.format import fmt
from autopar.spec.presets import get_preset, preset_aliases
from autopar.spec.training_run import gpu_hours_text, money_text, significant, tokens_text


def test_8b_is_llama3_8b_and_models_lists_the_aliases(cli_run) -> None:
    assert get_preset("8b") == get_preset("llama3-8b")
    # models.toml: 70b and 405b as before, 8b beside them
    aliases = preset_aliases()
    assert aliases["8b"] == "llama3-8b" and aliases["70b"] == "llama3-70b" and aliases["405b"] == "llama3.1-405b"
    assert "llama3-8b" not in aliases  # a preset's own name is no alias
    r = cli_run("models")
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("Aliases") :]
    rows = {tuple(line.split()) for line in table.splitlines()}
    assert ("8b", "llama3-8b") in rows and ("405b", "llama3.1-405b") in rows
    doc = json.loads(cli_run("models", "--json").stdout)
    assert next(m for m in doc if m["name"] == "llama3-8b")["aliases"] == ["8b"]


def test_figures_without_e_notation_by_hand() -> None:
    assert significant(14_080.0) == "14,080"  # not 1.41e+04
    assert significant(3.29e-3) == "0.00329"  # not 3.29e-03
    assert significant(3.29e-12) == "0"  # below a millionth: 0 at MAX_DECIMALS = 6
    assert significant(535.94) == "536" and significant(2.5) == "2.5" and significant(60.0) == "60"
    assert gpu_hours_text(3_290_000.0) == "3.29M" and gpu_hours_text(14_080.0) == "14.1k"
    assert gpu_hours_text(412.0) == "412" and gpu_hours_text(float("inf")) == "never"
    assert tokens_text(15e12) == "15T" and tokens_text(1e18) == "1,000P"  # not 1e+03P
    assert money_text(21_682_581) == "21.7M" and money_text(412.5) == "412.50"
    assert fmt(1.408e4) == "14,080" and fmt(1.5e-5) == "0.000015"


def test_fewer_tokens_than_one_step_is_refused(cli_run, one_line_error) -> None:
    # one step of llama3-8b at seq 8192 and the default ~4M tokens: 512 sequences x 8192 = 4,194,304
    step = 512 * 8192
    for command, plan in (("search", ["--run-dir", "/nonexistent/never-written"]), ("estimate", ["--tp", "2"])):
        one_line_error(
            cli_run(command, "--model", "8b", "--gpus", "16", *plan, "--tokens", "15"),
            ["--tokens 15", f"{step:,} tokens", f"--tokens {step} or more"],
        )


def test_search_whole_run_reads_well(cli_run, tmp_path) -> None:
    r = cli_run("search", "--model", "8b", "--gpus", "16", "--top-k", "1", "--tokens", "5M", "--run-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "e+" not in r.stdout and "e-0" not in r.stdout and "e-1" not in r.stdout, r.stdout


EXPORT = ["export", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "3"]
# the plan tests/export/test_export_cli.py exports with --to all: only torchtitan takes it
ZERO_BUBBLE = EXPORT + ["--pp-schedule", "zero-bubble", "--gbs", "32"]


def test_export_to_a_comma_list_skips_the_refused(cli_run, one_line_error, tmp_path) -> None:
    r = cli_run(*ZERO_BUBBLE, "--to", "torchtitan,megatron", "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    assert "megatron: skipped, " in r.stderr and "zero-bubble" in r.stderr
    assert {p.name for p in (tmp_path / "a").iterdir()} == {"torchtitan"}
    # every format of the list refused: one line naming each refusal
    one_line_error(cli_run(*ZERO_BUBBLE, "--to", "megatron,nemo", "--out", tmp_path / "b"), ["no format can run"])
    one_line_error(cli_run(*ZERO_BUBBLE, "--to", "megatron", "--out", tmp_path / "c"), ["zero-bubble"])


def test_a_missing_local_profile_is_one_line(cli_run, one_line_error, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a short path: the error line quotes it whole
    monkeypatch.setenv("AUTOPAR_LOCAL_PROFILE", "typo.yaml")
    one_line_error(
        cli_run("estimate", "--model", "tiny", "--gpus", "1", "--gpu", "local"),
        ["AUTOPAR_LOCAL_PROFILE", "typo.yaml", "does not exist"],
    )


def test_default_batch_adapts_to_24576_gpus(cli_run, one_line_error, tmp_path) -> None:
    """405B on 24,576 GPUs: the default 512 sequences split over no layout (dp is at least 24,576 /
    (8 tp x 16 pp x ...)); the search takes the smallest batch above 512 that one splits and says so."""
    args = ["search", "--model", "405b", "--gpus", "24576", "--top-k", "1"]
    r = cli_run(*args, "--run-dir", tmp_path / "a", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    gbs = doc["global_batch_size"]
    top = doc["top"][0]["plan"]
    # by hand: a multiple of micro-batch x dp of the winner, and above 512
    assert gbs > 512 and gbs % (top["micro_batch_size"] * top["dp"]) == 0
    assert top["tp"] * top["pp"] * top["cp"] * top["dp"] == 24576
    adapted = [n for n in doc["notes"] if n.startswith("the default global batch")]
    assert len(adapted) == 1 and f"uses {gbs:,} sequences" in adapted[0]
    # 24,576 / 576 = 42.7: a replica spans at least 43 GPUs, more than tp 8 takes
    assert any("is what forces" in n and "at least 43 GPUs" in n for n in doc["notes"]) == (gbs == 576)
    # a --gbs the user gave is refused as before
    one_line_error(cli_run(*args, "--gbs", "512", "--run-dir", tmp_path / "b"), ["--gbs 512", "cannot be split"])


def test_the_batch_forcing_pp_cp_is_said(cli_run, tmp_path) -> None:
    r = cli_run("search", "--model", "405b", "--gpus", "16384", "--top-k", "1", "--run-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    # 16,384 / 512 = 32 GPUs per replica at the most dp, beyond tp's 8: pp or cp must take the rest
    # wrapped at the terminal's width (120 when piped): the notice is the paragraph that says it
    paragraphs = " ".join(r.stdout.split()).split("autopar: ")
    line = "autopar: " + next(x for x in paragraphs if "is what forces" in x)
    assert line.startswith("autopar: warning: the global batch (512 sequences)") and "at least 32 GPUs" in line
    assert max(len(x) for x in r.stdout.splitlines()) <= 120


def test_at_32768_gpus_the_batch_warning_says_what_it_costs(cli_run, tmp_path) -> None:
    """DeepSeek-V3 on 32,768 GB200 at the default 1,024 sequences: the warning gives the MFU here and
    at the batch DeepSeek-V3 trained with (15,360 sequences of 4,096 tokens, its report cited), read
    back from that batch's own search, and the what-if to run; the batch itself stays 1,024."""
    args = ["search", "--model", "deepseek-v3", "--gpus", "32768", "--gpu", "gb200", "--top-k", "1"]
    r = cli_run(*args, "--run-dir", tmp_path / "a", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["global_batch_size"] == 1024
    note = next(n for n in doc["notes"] if "is what forces" in n)
    here = 100 * doc["top"][0]["mfu"]
    assert f"What it costs: {here:.1f} % MFU here" in note
    assert "--gbs 15,360 (62,914,560 tokens per step: DeepSeek-V3 report (arXiv 2412.19437) sec. 4.2" in note
    assert "the what-if: --gbs 1024,15360" in note
    big = json.loads(cli_run(*args, "--gbs", "15360", "--run-dir", tmp_path / "b", "--json").stdout)
    w = big["top"][0]
    assert f"against {100 * w['mfu']:.1f} % for {w['plan_name']} at --gbs 15,360" in note
    assert w["mfu"] > doc["top"][0]["mfu"]
