"""The single-process reference of a trial, and how far the parallel run is from it.

The reference is the same model (same padded vocabulary, seed and initial values), the same
synthetic global batch per step, the same optimizer: one process, the whole batch at once, the
mean token cross-entropy. Distances are relative: per tensor |a - b| / |b| (Frobenius), and per
step |loss_a - loss_b| / |loss_b|; `update` is the same distance on the change from the initial
value, which shows the check would see a wrong gradient even when updates are small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.measured.config import TrialConfig
from autopar.trial.batch import synthetic_batch
from autopar.trial.loss import cross_entropy
from autopar.trial.model import ModelConfig, build_model, initial_value
from autopar.trial.optim import make_optimizer

_CACHE: dict[str, "Reference"] = {}


@dataclass
class Reference:
    losses: list[float]
    params: dict[str, torch.Tensor]


def reference_run(cfg: TrialConfig, config: ModelConfig, global_batch: int) -> Reference:
    """Train the plain model on one process (CPU, fp32) exactly as the trial trains its shards."""
    key = repr((config, cfg.steps, cfg.seed, cfg.optimizer, cfg.lr, global_batch))
    if key in _CACHE:
        return _CACHE[key]
    torch.manual_seed(cfg.seed)
    model = build_model(config, cfg.seed, "cpu")
    opt = make_optimizer(list(model.parameters()), cfg.optimizer, cfg.lr)
    losses = []
    for step in range(cfg.steps):
        tokens, targets = synthetic_batch(cfg.seed, step, global_batch, config.max_seq_len, config.spec.vocab_size)
        loss = cross_entropy(model(tokens), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    ref = Reference(losses=losses, params={n: p.detach().clone() for n, p in model.named_parameters()})
    _CACHE[key] = ref
    return ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def compare(
    cfg: TrialConfig, config: ModelConfig, global_batch: int, losses: list[float], params: dict[str, torch.Tensor]
) -> dict:
    """Distances of a parallel run (global losses, gathered full parameters) from the reference."""
    ref = reference_run(cfg, config, global_batch)
    missing = sorted(set(ref.params) - set(params))
    extra = sorted(set(params) - set(ref.params))
    per_param, per_update, mismatched = {}, {}, []
    for name, want in ref.params.items():
        got = params.get(name)
        if got is None:
            continue
        if got.shape != want.shape:
            mismatched.append(name)
            continue
        per_param[name] = _rel(got, want)
        init = initial_value(config, name, tuple(want.shape), cfg.seed)
        per_update[name] = _rel(got - init, want - init)
    loss_rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref.losses)]
    worst = max(per_param, key=per_param.__getitem__) if per_param else None
    return {
        "reference_losses": ref.losses,
        "losses": losses,
        "loss_max_rel": max(loss_rel) if loss_rel else None,
        "param_max_rel": per_param[worst] if worst else None,
        "param_worst": worst,
        "update_max_rel": max(per_update.values()) if per_update else None,
        "params_compared": len(per_param),
        "missing": missing,
        "unexpected": extra,
        "shape_mismatch": mismatched,
    }
