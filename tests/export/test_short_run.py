"""`ExportOptions.short_run_steps` (`autopar export --short-run K`, the own-trainer measured stage):
every exporter writes the run's settings where its trainer reads them and leaves the plan as it was;
torchtitan's flags are read back by the installed torchtitan's own config manager."""

from __future__ import annotations

import importlib
import shlex
import sys

import pytest

from autopar.export import ExportOptions, get_exporter
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.spec.resolve import resolve_cluster


def test_short_run_export_is_the_plan_plus_the_run_settings() -> None:
    """The short run changes the run, not the plan: every exporter reads the same plan back."""
    model, cluster = get_preset("tiny"), resolve_cluster("h100-sxm", None, None, None)
    base = dict(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=8)
    cases = [
        ("megatron", {}, {}, ["--mock-data", "--train-iters 7", "--eval-iters 0", "--log-interval 1"]),
        ("deepspeed", {"zero_stage": 2}, {}, ['"steps_per_print": 1', '"wall_clock_breakdown": true']),
        ("bridge", {}, {"recipe": "llama32_1b_pretrain_config"}, ["train.train_iters=7", "checkpoint.save=null"]),
        ("nemo", {}, {"recipe": "llama32_1b"}, ["'trainer.max_steps': 7", "NEMO_LOG_MEMORY_USAGE=1"]),
        ("torchtitan", {"zero_stage": 3}, {"torchtitan_base": "m.c:f"}, ["--training.steps 7 --metrics.log_freq 1"]),
    ]
    for name, plan_extra, opts, expect in cases:
        plan = ParallelPlan(**base, **plan_extra, trainer=name)
        e = get_exporter(name)
        short = e.render(plan, model, cluster, ExportOptions(short_run_steps=7, **opts))
        full = e.render(plan, model, cluster, ExportOptions(**opts))
        assert e.parse(short) == e.parse(full), name
        text = "\n".join(f.text for f in short.files)
        for word in expect:
            assert word in text, (name, word)
        assert "short run: 7 steps on mock data" in text
        assert "--save" not in text.split("USER_ARGS=(")[-1] if "USER_ARGS=(" in text else True


def test_torchtitan_reads_the_short_run_flags(tmp_path, monkeypatch):
    """The launch script's torchtitan flags through torchtitan 0.3.0's ConfigManager (tyro): the
    steps, the log frequency and plain lines, on the exported plan's own config."""
    pytest.importorskip("torchtitan")
    from torchtitan.config import ConfigManager

    plan = ParallelPlan(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1, global_batch_size=64, trainer="torchtitan")
    bundle = get_exporter("torchtitan").render(
        plan, get_preset("llama3-8b"), resolve_cluster("h100-sxm", None, None, None), ExportOptions(short_run_steps=9)
    )
    bundle.write(tmp_path)
    line = next(ln for ln in bundle.text("launch_torchrun.sh").splitlines() if "-m torchtitan.train" in ln)
    args = shlex.split(line.split("-m torchtitan.train", 1)[1].replace('"$@"', ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "autopar_torchtitan", raising=False)
    full = importlib.import_module("autopar_torchtitan").autopar_plan()
    parsed = ConfigManager().parse_args(args)
    assert parsed.training.steps == 9 and parsed.metrics.log_freq == 1 and parsed.metrics.disable_color_printing
    assert parsed.parallelism == full.parallelism
    assert not parsed.checkpoint.enable and not parsed.validator.enable  # no checkpoint, no validation
