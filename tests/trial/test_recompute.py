"""Activation recomputation in the built-in model, on one process: the same loss and gradients as
without it, the same parameter names, and the activation bytes it keeps equal to the cost model's
"torch" stack formulas (autopar.cost.activations eager_*), measured with the tensor tracker.
The distributed compositions (TP, PP, FSDP2, CP, MoE) are parity cases in conftest.py."""

from __future__ import annotations

import gc

import pytest
import torch

from autopar.cost import activations as act
from autopar.measured.features import plan_problems
from autopar.spec.plan import ParallelPlan
from autopar.spec.presets import get_preset
from autopar.trial.loss import cross_entropy
from autopar.trial.memory import TensorPeak, _is_tensor
from autopar.trial.model import ModelConfig, build_model
from autopar.trial.parallel.recompute import apply_ac, recomputed_layers

pytestmark = [pytest.mark.slow]  # the model runs forward and backward per mode: about 6 s

SEQ, BATCH, VOCAB_ROWS = 128, 2, 512


def _model(num_layers: int = 4, mode: str = "none", layers=None):
    spec = get_preset("tiny").scaled(num_layers=num_layers)
    model = build_model(ModelConfig(spec=spec, vocab_rows=VOCAB_ROWS, max_seq_len=SEQ), seed=3)
    apply_ac(model, mode, layers)
    return model, spec


def _batch():
    g = torch.Generator().manual_seed(7)
    return (torch.randint(0, 512, (BATCH, SEQ), generator=g), torch.randint(0, 512, (BATCH, SEQ), generator=g))


@pytest.mark.parametrize("mode,layers", [("full", None), ("full", [1, 2]), ("selective", None)])
def test_same_gradients_and_names(mode, layers) -> None:
    x, y = _batch()
    ref, _ = _model()
    cross_entropy(ref(x), y).backward()
    model, _ = _model(mode=mode, layers=layers)
    loss = cross_entropy(model(x), y)
    loss.backward()
    assert loss.item() == cross_entropy(ref(x), y).item()
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    assert list(got) == list(want)  # no _checkpoint_wrapped_module in the names
    for name, p in want.items():
        torch.testing.assert_close(got[name].grad, p.grad, rtol=0, atol=0)


def _kept_after_forward(num_layers: int, mode: str) -> int:
    """Bytes of tensor storage a forward leaves alive (what the backward will use)."""
    model, _ = _model(num_layers, mode)
    x, y = _batch()
    gc.collect()
    with TensorPeak([o for o in gc.get_objects() if _is_tensor(o)]) as tracker:
        loss = cross_entropy(model(x), y)
        kept = tracker.current - tracker.start
    del loss
    return kept


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_kept_bytes_equal_the_eager_formulas(mode) -> None:
    """One layer more keeps exactly the formula's layer bytes; the rest is the head's (plus the
    two scalars of the loss)."""
    spec = get_preset("tiny")
    two, three = _kept_after_forward(2, mode), _kept_after_forward(3, mode)
    tokens = BATCH * SEQ
    if mode == "full":  # only the block input [b, s, h], fp32
        layer = act.layer_input_bytes(spec, tokens, 1, False) * 2.0
    else:
        layer = act.eager_dense_layer_bytes(spec, tokens, 1, False, 1, 4.0, selective=mode == "selective")
    assert three - two == layer
    head = act.eager_head_bytes(spec, tokens, 1, False, 4.0)
    assert 0 <= two - 2 * layer - head <= 16


def test_selective_keeps_less_than_none_and_full_least() -> None:
    none, sel, full = (_kept_after_forward(4, m) for m in ("none", "selective", "full"))
    assert full < sel < none


def test_recomputed_layers_per_pipeline_rank() -> None:
    # 8 layers, pp2 x vpp2: rank 0 holds stages 0 and 2 (layers 0-1, 4-5), rank 1 stages 1 and 3
    plan = ParallelPlan(pp=2, vpp=2, dp=1, recompute="full", recompute_layers=3, global_batch_size=4)
    assert recomputed_layers(plan, 8, 0) == [0, 1, 4]
    assert recomputed_layers(plan, 8, 1) == [2, 3, 6]
    every = plan.with_(recompute_layers=None)
    assert recomputed_layers(every, 8, 1) == [2, 3, 6, 7]


def test_plans_with_recompute_are_built() -> None:
    for mode in ("selective", "full"):
        assert plan_problems(ParallelPlan(tp=2, recompute=mode, global_batch_size=2)) == []
