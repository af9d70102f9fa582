"""The exporter contract (autopar/export/base.py), run against every registered exporter.

For every plan of export_cases.CASES and every exporter variant: the export is refused with an
InputError naming the reason (where the case says so), or it parses back to the same degrees,
batch sizes, schedule, layout and recompute choice; the world size and the batch arithmetic hold;
every file carries the header; scripts are valid bash; rendering is deterministic.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from export_cases import CASES, CLUSTER, VARIANTS

from autopar.errors import InputError
from autopar.export import EXPORTERS, ExportRefused, get_exporter, plan_view

PAIRS = [(c, v) for c in CASES for v in VARIANTS]


def _render(case, variant):
    _, name, opts = variant
    return get_exporter(name).render(case.plan, case.spec, case.cluster, case.options(opts))


def test_every_registered_exporter_has_a_variant() -> None:
    assert {name for _, name, _ in VARIANTS} == set(EXPORTERS)


def test_the_cases_cover_every_axis() -> None:
    plans = [c.plan for c in CASES]
    assert any(p.tp > 1 for p in plans) and any(p.cp > 1 for p in plans) and any(p.ep > 1 for p in plans)
    assert any(p.vpp > 1 for p in plans) and any(p.etp == 1 and p.tp > 1 and p.ep > 1 for p in plans)
    assert any(p.etp == p.tp > 1 and p.ep > 1 for p in plans)
    assert {p.zero_stage for p in plans} == {0, 1, 2, 3}
    assert {p.recompute for p in plans} == {"none", "selective", "full"}
    assert any(p.recompute_layers for p in plans)
    assert {p.pp_schedule for p in plans if p.pp > 1} == {"1f1b", "interleaved-1f1b", "zero-bubble", "gpipe"}
    assert {p.dtype for p in plans} == {"bf16", "fp8", "fp32"}
    assert any(p.tp_comm_overlap for p in plans) and any(not p.main_grads_fp32 for p in plans)
    uneven = [c for c in CASES if c.plan.pp > 1 and len(set(c.plan.resolved_layout(c.spec.num_layers).stages)) > 1]
    assert len(uneven) >= 3


def test_every_exporter_accepts_some_plans() -> None:
    for vid, _, _ in VARIANTS:
        accepted = [c.id for c in CASES if vid not in c.refuse]
        assert len(accepted) >= 5, (vid, accepted)


@pytest.mark.parametrize("case,variant", PAIRS, ids=[f"{c.id}-{v[0]}" for c, v in PAIRS])
def test_round_trip_or_refusal(case, variant) -> None:
    vid, name, _ = variant
    exporter = get_exporter(name)
    if vid in case.refuse:
        with pytest.raises(ExportRefused) as err:
            _render(case, variant)
        msg = str(err.value)
        assert isinstance(err.value, InputError)
        assert "\n" not in msg and "cannot run this plan: " in msg
        assert case.refuse[vid].lower() in msg.lower(), msg
        return
    bundle = _render(case, variant)
    expected = plan_view(case.plan.with_(trainer=bundle.meta["trainer"]), case.spec)  # the plan it runs
    assert exporter.parse(bundle) == expected
    # world size and batch arithmetic
    got = exporter.parse(bundle)
    assert got["tp"] * got["pp"] * got["cp"] * got["dp"] == got["num_gpus"] == case.gpus
    assert got["global_batch_size"] == got["micro_batch_size"] * got["num_microbatches"] * got["dp"]
    if got["layout"] is not None:
        assert sum(got["layout"]) == case.spec.num_layers and len(got["layout"]) == got["pp"] * got["vpp"]
    # deterministic
    assert _render(case, variant) == bundle


@pytest.mark.parametrize(
    "case,variant",
    [(c, v) for c, v in PAIRS if v[0] not in c.refuse][:40],
    ids=[f"{c.id}-{v[0]}" for c, v in PAIRS if v[0] not in c.refuse][:40],
)
def test_every_file_has_the_header(case, variant) -> None:
    bundle = _render(case, variant)
    for f in bundle.files:
        text = f.text
        if f.name.endswith(".json"):
            header = json.loads(text)["_autopar"]
            assert header["model"] == case.spec.name and header["num_gpus"] == case.gpus
            assert {"predicted_peak_memory_gib", "predicted_step_time_s", "predicted_mfu", "command"} <= set(header)
            continue
        head = "\n".join(text.splitlines()[:25])
        for word in (
            "autopar export:",
            "model:",
            "cluster:",
            "predicted:",
            "GiB peak memory",
            "step",
            "MFU",
            "produced by: autopar",
        ):
            assert word in head, (f.name, word)


SCRIPTS = [
    (c, v)
    for c, v in PAIRS
    if v[0] not in c.refuse and c.id in ("tp-pp-1f1b", "cp-long-context", "moe-etp1", "uneven-layout-string")
]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("case,variant", SCRIPTS, ids=[f"{c.id}-{v[0]}" for c, v in SCRIPTS])
def test_scripts_are_valid_bash(case, variant, tmp_path) -> None:
    bundle = _render(case, variant)
    bundle.write(tmp_path)
    for f in bundle.files:
        if f.name.endswith((".sh", ".sbatch")):
            p = subprocess.run(["bash", "-n", str(tmp_path / f.name)], capture_output=True, text=True)
            assert p.returncode == 0, (f.name, p.stderr)
            assert f.executable or f.name.endswith("_args.sh")


def test_launch_scripts_keep_ranks_consecutive_per_node() -> None:
    case = next(c for c in CASES if c.id == "tp-pp-1f1b")
    b = get_exporter("megatron").render(case.plan, case.spec, case.cluster, case.options({}))
    torchrun, sbatch = b.text("launch_torchrun.sh"), b.text("launch_slurm.sbatch")
    assert "--nnodes 8 --nproc_per_node 8 --node_rank" in torchrun
    assert "#SBATCH --ntasks-per-node=8" in sbatch and "--distribution=block:block" in sbatch
    assert "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in sbatch
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in torchrun
    t = get_exporter("torchtitan").render(case.plan.with_(zero_stage=3), case.spec, CLUSTER, case.options({}))
    assert "--rdzv_backend c10d" in t.text("launch_slurm.sbatch")
    assert "#SBATCH --ntasks-per-node=1" in t.text("launch_slurm.sbatch")


def test_uneven_megatron_export_reproduces_the_layout() -> None:
    """Issue 9: first/last-stage flags when they reproduce the layout, else the layout flag."""
    from autopar.export.bash import read_bash_array

    def argv(case_id):
        c = next(x for x in CASES if x.id == case_id)
        b = get_exporter("megatron").render(c.plan, c.spec, CLUSTER, c.options({}))
        return read_bash_array(b.text("megatron_args.sh"), "AUTOPAR_ARGS")

    a = argv("uneven-first-last")
    assert a[a.index("--decoder-first-pipeline-num-layers") + 1] == "18"
    assert a[a.index("--decoder-last-pipeline-num-layers") + 1] == "22"
    assert "--pipeline-model-parallel-layout" not in a
    a = argv("uneven-first-only-vpp")
    assert a[a.index("--decoder-first-pipeline-num-layers") + 1] == "14"
    assert "--decoder-last-pipeline-num-layers" not in a
    assert a[a.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in a
    a = argv("uneven-layout-string")
    assert a[a.index("--pipeline-model-parallel-layout") + 1] == "Et*19|t*21|t*19|t*21L"
    assert "--decoder-first-pipeline-num-layers" not in a
    a = argv("vpp-embedding-loss-balanced")
    assert "--pipeline-model-parallel-layout" in a and "--num-layers-per-virtual-pipeline-stage" not in a
    a = argv("vpp-interleaved-full")
    assert a[a.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"


def test_nemo_and_bridge_carry_the_uneven_layout() -> None:
    c = next(x for x in CASES if x.id == "uneven-first-last")
    nemo = get_exporter("nemo").render(c.plan, c.spec, CLUSTER, c.options({})).text("nemo_overrides.txt")
    assert "trainer.strategy.num_layers_in_first_pipeline_stage=18" in nemo
    assert "trainer.strategy.num_layers_in_last_pipeline_stage=22" in nemo
    bridge = get_exporter("bridge").render(c.plan, c.spec, CLUSTER, c.options({})).text("bridge_overrides.txt")
    assert "model.num_layers_in_first_pipeline_stage=18" in bridge
    c = next(x for x in CASES if x.id == "uneven-layout-string")
    bridge = get_exporter("bridge").render(c.plan, c.spec, CLUSTER, c.options({})).text("bridge_overrides.txt")
    assert "model.pipeline_model_parallel_layout='Et*19|t*21|t*19|t*21L'" in bridge


def test_models_without_a_trainer_preset_need_a_base() -> None:
    from autopar.export import ExportOptions

    spec = CASES[0].spec.scaled(num_layers=8)  # "llama3-8b-proxy": no torchtitan / NeMo / Bridge preset
    plan = CASES[0].plan.with_(zero_stage=3)
    for name, word in (("torchtitan", "--torchtitan-base"), ("nemo", "--recipe"), ("bridge", "--recipe")):
        with pytest.raises(ExportRefused, match=word):
            get_exporter(name).render(plan, spec, CLUSTER)
    opts = ExportOptions(torchtitan_base="torchtitan.models.llama3.config_registry:llama3_8b", recipe="llama3_8b")
    b = get_exporter("torchtitan").render(plan, spec, CLUSTER, opts)
    assert "from torchtitan.models.llama3.config_registry import llama3_8b as base_config" in b.text(
        "autopar_torchtitan.py"
    )
    assert get_exporter("nemo").parse(get_exporter("nemo").render(plan, spec, CLUSTER, opts)) == plan_view(plan, spec)
