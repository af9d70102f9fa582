"""The plan flags are declared once (autopar/cli/plan_flags.py) and reach the library as one
PlanRequest: every command that takes a plan has every flag, with the same option names; bad values
are one line naming the option and the value; `rebase_plan` changes a ranked plan the way
`autopar export --run` documents."""

from __future__ import annotations

from dataclasses import fields

import pytest
import typer

from autopar.cli import app, main
from autopar.cli.plan_flags import PLAN_OPTIONS, with_plan_flags
from autopar.errors import InputError
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import resolve_model
from autopar.spec.resolve import PlanRequest, option, rebase_plan, resolve_plan

FIELDS = [f.name for f in fields(PlanRequest)]


def cli(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _options(command) -> dict[str, list[str]]:
    return {p.name: p.opts + p.secondary_opts for p in command.params if p.param_type_name == "option"}


def _command(name: str):
    from autopar.cli import _register

    _register()
    return typer.main.get_command(app).commands[name]


@pytest.mark.parametrize("name", ["estimate", "export"])
def test_every_plan_flag_is_an_option_of_the_command(name) -> None:
    opts = _options(_command(name))
    for f in FIELDS:
        assert f in opts, (name, f)
        assert option(f) in opts[f]
    assert "plan" not in opts


def test_compare_flag_strings_take_every_plan_flag() -> None:
    from autopar.cli.compare import _flags

    opts = _options(typer.main.get_command(_flags))
    assert set(FIELDS) <= set(opts)


def test_the_decorator_hands_the_command_one_request() -> None:
    seen = {}
    toy = typer.Typer()

    @toy.command()
    @with_plan_flags
    def run(name: str = "x", plan: PlanRequest = PlanRequest()) -> None:
        seen["name"], seen["plan"] = name, plan

    toy(
        [
            "--name",
            "y",
            "--tp",
            "8",
            "--no-sp",
            "--pp-loss-as-layer",
            "--trainer",
            "torchtitan",
            "--capacity-factor",
            "1.5",
        ],
        standalone_mode=False,
    )
    assert seen["name"] == "y"
    assert seen["plan"] == PlanRequest(tp=8, sp=False, pp_loss_as_layer=True, trainer="torchtitan", capacity_factor=1.5)
    toy([], standalone_mode=False)
    assert seen["plan"] == PlanRequest() and seen["plan"].given() == {}
    assert tuple(PLAN_OPTIONS) == tuple(FIELDS)


def test_a_command_cannot_declare_a_plan_flag_twice() -> None:
    def twice(tp: int = 1, plan: PlanRequest = PlanRequest()) -> None: ...

    with pytest.raises(TypeError, match="tp"):
        with_plan_flags(twice)


#: one bad value per option (typer/click catches the non-numbers, PlanRequest.check the rest)
BAD = {
    "tp": "0",
    "pp": "-2",
    "vpp": "0",
    "cp": "0",
    "dp": "0",
    "ep": "0",
    "etp": "0",
    "zero": "4",
    "mbs": "0",
    "gbs": "0",
    "pp_schedule": "gpipes",
    "recompute": "partial",
    "recompute_layers": "-1",
    "dtype": "fp16",
    "grads": "fp16",
    "pp_layout": "4,x",
    "pp_first": "-1",
    "pp_last": "-3",
    "trainer": "megatorn",
    "moe_dispatch": "dropful",
    "capacity_factor": "100",
    "moe_dispatcher": "nccl",
    "recompute_modules": "attn",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_values_are_one_line_naming_the_option_and_value(name, capsys) -> None:
    argv = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", option(name), BAD[name]]
    code, out, err = cli(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("autopar: error: "), err
    assert option(name) in err and BAD[name] in err, err


def test_the_old_keyword_form_still_resolves() -> None:
    """cli/trial.py calls resolve_plan(model, gpus, seq, tp=..., embedding_as_layer=...) until it adopts
    PlanRequest: the same plan as the request form."""
    m = resolve_model("llama3-70b")
    old = resolve_plan(
        m,
        64,
        8192,
        tp=8,
        pp=4,
        zero=0,
        recompute="full",
        recompute_layers=2,
        embedding_as_layer=True,
        loss_as_layer=False,
        tp_comm_overlap=False,
        dtype="bf16",
    )
    new = resolve_plan(
        m, 64, 8192, PlanRequest(tp=8, pp=4, zero=0, recompute="full", recompute_layers=2, pp_embedding_as_layer=True)
    )
    assert old == new and old.layout is not None
    with pytest.raises(TypeError, match="bogus"):
        resolve_plan(m, 64, 8192, bogus=1)


def test_defaults_and_capacity() -> None:
    m = resolve_model("mixtral-8x7b")
    p = resolve_plan(m, 64, 4096, PlanRequest(tp=2, ep=8))
    assert (p.dp, p.zero_stage, p.trainer, p.moe_dispatch, p.capacity_factor) == (32, 1, "megatron", "dropless", None)
    p = resolve_plan(m, 64, 4096, PlanRequest(tp=2, ep=8, capacity_factor=1.25))
    assert (p.moe_dispatch, p.capacity_factor) == ("capacity", 1.25)
    assert resolve_plan(m, 64, 4096, PlanRequest(moe_dispatch="capacity")).capacity_factor == 1.0
    with pytest.raises(InputError, match="--capacity-factor 1.5 needs --moe-dispatch capacity"):
        resolve_plan(m, 64, 4096, PlanRequest(moe_dispatch="dropless", capacity_factor=1.5))
    with pytest.raises(InputError, match="dense"):
        resolve_plan(resolve_model("llama3-8b"), 8, 4096, PlanRequest(moe_dispatch="capacity"))
    with pytest.raises(InputError, match="--moe-dispatcher deepep, --ep-comm-overlap need a mixture-of-experts"):
        resolve_plan(resolve_model("llama3-8b"), 8, 4096, PlanRequest(moe_dispatcher="deepep", ep_comm_overlap=True))
    p = resolve_plan(m, 64, 4096, PlanRequest(ep=8, moe_dispatcher="deepep", ep_comm_overlap=True))
    assert (p.moe_dispatcher, p.ep_comm_overlap) == ("deepep", True)
    q = rebase_plan(p, PlanRequest(zero=3), m, 64, 4096)
    assert (q.moe_dispatcher, q.ep_comm_overlap, q.zero_stage) == ("deepep", True, 3)


BASE = ParallelPlan(
    tp=4,
    pp=4,
    dp=8,
    cp=2,
    vpp=2,
    zero_stage=3,
    micro_batch_size=2,
    global_batch_size=512,
    recompute="full",
    recompute_layers=2,
    tp_comm_overlap=True,
    trainer="megatron",
)


def test_rebase_without_flags_is_the_plan_itself() -> None:
    assert rebase_plan(BASE, PlanRequest(), resolve_model("llama3-70b"), 256, 8192) is BASE


@pytest.mark.parametrize(
    "request_,expected",
    [
        (PlanRequest(zero=1), dict(zero_stage=1, dp=8, vpp=2, pp_schedule="interleaved-1f1b", recompute_layers=2)),
        (PlanRequest(tp=8), dict(tp=8, dp=4, etp=8, sequence_parallel=True, micro_batch_size=2)),
        (PlanRequest(vpp=1), dict(vpp=1, pp_schedule="1f1b")),
        (
            PlanRequest(vpp=1, pp_schedule="zero-bubble", trainer="torchtitan"),
            dict(pp_schedule="zero-bubble", trainer="torchtitan", tp_comm_overlap=True),
        ),
        (PlanRequest(recompute="selective"), dict(recompute="selective", recompute_layers=None)),
        (
            PlanRequest(recompute="selective", recompute_modules="layernorm,mlp"),
            dict(recompute="selective", recompute_modules=("layernorm", "mlp"), recompute_layers=None),
        ),
        (PlanRequest(pp=8, vpp=1), dict(pp=8, dp=4, pp_schedule="1f1b", layout=None)),
    ],
)
def test_rebase_lets_what_follows_a_changed_flag_follow_it(request_, expected) -> None:
    got = rebase_plan(BASE, request_, resolve_model("llama3-70b"), 256, 8192)
    for k, v in expected.items():
        assert getattr(got, k) == v, (k, getattr(got, k), v)
    kept = {"global_batch_size", "dtype", "main_grads_fp32", "cp"} - set(expected)
    for k in kept:
        assert getattr(got, k) == getattr(BASE, k), k


def test_rebase_keeps_an_uneven_layout_while_pp_and_vpp_stay() -> None:
    m = resolve_model("llama3-70b")
    base = resolve_plan(m, 256, 8192, PlanRequest(tp=8, pp=4, pp_layout="19,21,19,21", zero=1))
    assert rebase_plan(base, PlanRequest(zero=3), m, 256, 8192).layout == base.layout
    assert rebase_plan(base, PlanRequest(pp=8), m, 256, 8192).layout is None
    assert rebase_plan(base, PlanRequest(pp_first=18, pp_last=22), m, 256, 8192).layout.stages == (18, 20, 20, 22)


def test_estimate_says_which_trainer_and_profile(capsys) -> None:
    import json

    code, out, err = cli(
        [
            "estimate",
            "--model",
            "llama3-70b",
            "--gpus",
            "256",
            "--tp",
            "8",
            "--pp",
            "4",
            "--zero",
            "3",
            "--trainer",
            "torchtitan",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    d = json.loads(out)
    assert (d["trainer"], d["profile"], d["plan"]["trainer"]) == ("torchtitan", "torchtitan", "torchtitan")
    code, out, err = cli(["estimate", "--model", "llama3-70b", "--gpus", "256", "--tp", "8", "--pp", "4"], capsys)
    assert code == 0 and "trainer Megatron-LM (megatron), performance profile megatron" in out


def test_compare_layouts_on_different_trainers(capsys) -> None:
    import json

    code, out, err = cli(
        [
            "compare",
            "--model",
            "llama3-70b",
            "--gpus",
            "256",
            "--tp 8 --pp 4 --zero 3",
            "--tp 8 --pp 4 --zero 1 --trainer deepspeed",
            "--trainer",
            "torchtitan",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    layouts = json.loads(out)["layouts"]
    assert [x["plan"]["trainer"] for x in layouts] == ["torchtitan", "deepspeed"]  # --trainer: the default only
    assert layouts[0]["step_time_s"] != layouts[1]["step_time_s"]  # each priced with its trainer's profile
