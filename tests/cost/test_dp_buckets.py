"""Data-parallel traffic issued bucket by bucket: every bucket but the last reduced (and the first
gathered) hides under the backward (forward) it overlaps; that one is exposed. Megatron-Core
launches each bucket the moment its gradients are ready, so its overlap is 1 by that mechanism, not
a fitted fraction. Figures derived by hand below."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from autopar.calibration.profile_fit import _parameters
from autopar.cost.profiles import pinned, profiles
from autopar.cost.step import dp_exposed


def _inputs(reduce_s, reduce_tail_s, gather_s=0.0, gather_tail_s=0.0, zero3=False, microbatches=1, sm=0.1):
    a = np.array
    return SimpleNamespace(
        dp_reduce=a([reduce_s]),
        dp_gather=a([gather_s]),
        dp_reduce_tail=a([reduce_tail_s]),
        dp_gather_tail=a([gather_tail_s]),
        comm_sm_share=a([sm]),
        zero3=a([zero3]),
        microbatches=a([float(microbatches)]),
    )


def test_every_bucket_but_the_last_hides_under_the_backward() -> None:
    # 1.0 s of reduction in ten buckets beside a 0.9 s micro-batch (backward 0.6 s): the last
    # bucket (0.1 s) is exposed; 0.6 s of the other 0.9 s hide, costing the backward 10 % of the
    # SMs for them (0.06 s); 0.3 s do not fit under it
    k = SimpleNamespace(dp_overlap=1.0)
    got = dp_exposed(_inputs(1.0, 0.1), k, np.array([0.9]))
    assert float(got[0]) == pytest.approx(0.1 + 0.3 + 0.6 * 0.1, rel=1e-12)


def test_one_bucket_cannot_overlap() -> None:
    # a model smaller than one bucket reduces after its backward: all of it exposed
    k = SimpleNamespace(dp_overlap=1.0)
    got = dp_exposed(_inputs(0.2, 0.2), k, np.array([5.0]))
    assert float(got[0]) == pytest.approx(0.2, rel=1e-12)


def test_zero3_exposes_the_first_gather_and_the_last_reduction() -> None:
    # ZeRO-3 over 4 micro-batches of 1 s: 2 s of reduction and 2 s of gathering, 0.05 s per unit
    # of each; the rest (3.9 s) hides under 0.9 x 4 s at 20 % of the SMs
    k = SimpleNamespace(dp_overlap=0.9)
    got = dp_exposed(_inputs(2.0, 0.05, 2.0, 0.05, zero3=True, microbatches=4, sm=0.2), k, np.array([1.0]))
    assert float(got[0]) == pytest.approx(0.1 + 3.6 * 0.2 + (3.9 - 3.6), rel=1e-12)


def test_megatrons_overlap_is_its_mechanism_not_a_fit() -> None:
    assert pinned("megatron", "dp_overlap") and not pinned("torchtitan", "dp_overlap")
    assert profiles()["megatron"].constants.dp_overlap == 1.0
    # Bridge and NeMo share the megatron profile; the trainers whose overlap differs fit their own
    assert ("megatron", "dp_overlap") not in _parameters(set(profiles()))
    assert ("torchtitan", "dp_overlap") in _parameters(set(profiles()))


def test_buckets_are_the_trainers() -> None:
    # 8 B parameters on a rank of 32 layers (+ embedding and head) reduced over 256 ranks:
    # Megatron buckets max(40 M, 1 M x 256) = 256 M parameters (32 calls); PyTorch DDP 25 MiB of
    # bf16 gradients (611 calls); DeepSpeed 5e8 elements (16 calls) at every ZeRO stage; FSDP and
    # Megatron-FSDP one call per unit (34) from ZeRO-2 up
    from autopar.cost.comm_terms import dp_buckets

    consts = {name: profiles()[name].constants for name in ("megatron", "torchtitan", "deepspeed")}
    units = np.array([34.0])

    def calls(profile, zero):
        x = SimpleNamespace(table=SimpleNamespace(zero_stage=np.array([zero])))
        return float(dp_buckets(x, np.array([8e9]), np.array([256]), units, consts[profile])[0])

    assert calls("megatron", 1) == 32 and calls("torchtitan", 0) == np.ceil(8e9 / (25 * 2**20 / 2)) == 611
    assert calls("deepspeed", 1) == calls("deepspeed", 3) == 16
    assert calls("megatron", 2) == calls("torchtitan", 3) == 34
