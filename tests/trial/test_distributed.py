"""The built-in parallel model under torchrun (CPU, gloo, fp32, tiny model): numerical equivalence
with the single-process model, exactness of the cost model's parameters and collective bytes, and
the worker's result document. The cases and their launches are in conftest.py (three launches,
one per world size, ~1.5 minutes together on 2 cores)."""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.timeout(900), pytest.mark.distributed, pytest.mark.slow]

AXES = ("tp", "cp", "ep", "pp", "dp")
PARITY_REL = 1e-5  # the acceptance bound, relative, on the loss and on every parameter


def test_launch_succeeds(world: int, launch_of) -> None:
    run = launch_of(world)
    assert run.result["complete"] is True
    assert [t["status"] for t in run.trials] == ["ok"] * len(run.trials)


def test_matches_single_process_run(case, result_of) -> None:
    """After 3 optimizer steps the loss of every step and every parameter (gathered to full
    tensors) equal the single-process run of the same model, seed and global batch."""
    par = result_of(case)["parity"]
    assert par["missing"] == [] and par["unexpected"] == [] and par["shape_mismatch"] == []
    assert par["params_compared"] > 0
    assert len(par["losses"]) == 3
    assert par["loss_max_rel"] <= PARITY_REL, par
    assert par["param_max_rel"] <= PARITY_REL, par
    # the check has teeth: the parameters moved, and the moves themselves agree (a wrong gradient
    # anywhere would show here far above summation noise)
    assert par["update_max_rel"] <= 1e-3, par
    assert par["reference_losses"][0] != par["reference_losses"][-1]


def test_parameters_and_bytes_equal_the_cost_model(case, result_of, predict) -> None:
    """Per rank: parameters held under TP, and the collective payload of one step per mesh axis,
    equal `estimate(...).extra["stages"][pp_rank]` byte for byte."""
    result = result_of(case)
    stages = predict(result)
    balanced = result["config"].get("moe_routing") == "balanced"
    for rank in result["ranks"]:
        want = stages[rank["coords"]["pp"]]
        sent, received = rank["extra"].get("ep_rows_sent"), rank["extra"].get("ep_rows_received")
        if sent is not None and not balanced:
            # learned / skewed routing: the cost model given this rank's measured routing imbalance
            # (rows received / rows sent, autopar.cost.comm.ep_calls)
            want = predict(result, routing_imbalance=received / sent)[rank["coords"]["pp"]]
            want = {"params": want["params"], "comm_bytes": {a: round(v) for a, v in want["comm_bytes"].items()}}
        if sent is not None and balanced:
            assert received == sent, f"forced-balanced routing received {received} rows, sent {sent}"
        want = {"params": want["params"], "comm_bytes": dict(want["comm_bytes"])}
        got = rank["comm"]["bytes_by_axis"]
        assert "other" not in got, f"rank {rank['rank']}: collectives on no mesh axis: {rank['comm']}"
        assert rank["param_count"] == want["params"], f"rank {rank['rank']} {rank['coords']}"
        measured = {a: got.get(a, 0) for a in AXES}
        assert measured == {a: want["comm_bytes"][a] for a in AXES}, (
            f"rank {rank['rank']} {rank['coords']}: measured {measured} vs cost model {want['comm_bytes']}; "
            f"calls {rank['comm']['calls_by_op']}"
        )


def test_result_document(world: int, launch_of) -> None:
    """The worker reports per-step time, tokens/s, peak memory and bytes per axis for every rank,
    parameter counts, the final loss and the environment."""
    run = launch_of(world)
    env = run.result["env"]
    assert env["backend"] == "gloo" and env["device"] == "cpu" and env["world_size"] == world
    assert env["torch"]
    for t in run.trials:
        if t["name"].startswith("memory:"):  # test_memory_accuracy.py's tensor-memory trials
            continue
        assert len(t["step_time_s"]) == 3 and all(x > 0 for x in t["step_time_s"])
        assert t["tokens_per_s"] > 0 and t["tokens_per_step"] == t["plan"]["global_batch_size"] * t["seq_len"]
        assert math.isfinite(t["final_loss"]) and t["final_loss"] == t["losses"][-1]
        assert t["model_flops_per_step"] > 0
        assert len(t["ranks"]) == world
        assert sorted(r["rank"] for r in t["ranks"]) == list(range(world))
        for r in t["ranks"]:
            assert r["peak_memory_bytes"] > 0 and r["memory_method"] == "VmHWM"
            assert r["param_count"] > 0
            assert set(r["comm"]["bytes_by_axis"]) <= set(AXES)
            assert len(r["step_times_s"]) == 3


def test_skewed_routing_gives_uneven_splits(result_of, case_named) -> None:
    """Skewed routing makes the all-to-all splits uneven (one EP rank receives far more rows than
    it sends, the other far fewer); parity with the single-process run (above) still holds."""
    case = case_named("ep2-skewed")
    result = result_of(case)
    ratios = sorted(r["extra"]["ep_rows_received"] / r["extra"]["ep_rows_sent"] for r in result["ranks"])
    assert ratios[0] < 0.8 and ratios[-1] > 1.2, ratios
    assert result["parity"]["param_max_rel"] <= PARITY_REL
