"""The MoE block's router on one process: routing modes, capacity factor, the auxiliary
load-balancing loss and its gradient path, and context-parallel token positions."""

from __future__ import annotations

import pytest
import torch

from autopar.spec.presets import get_preset
from autopar.trial.moe import MoE
from autopar.trial.parallel.context import cp_positions


def _moe(**kw) -> MoE:
    torch.manual_seed(0)
    m = MoE(get_preset("tiny-moe"), **kw)
    for p in m.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    return m


def test_balanced_routing_gives_every_expert_the_same_count() -> None:
    m = _moe(routing="balanced")
    x = torch.randn(2, 16, 128)
    m(x)
    assert m.last_counts.tolist() == [2 * 16 * 2 // 4] * 4


def test_skewed_routing_is_uneven() -> None:
    m = _moe(routing="skewed")
    m(torch.randn(2, 16, 128))
    c = m.last_counts.tolist()
    assert max(c) > 2 * min(c)


def test_capacity_factor_drops_copies_over_capacity() -> None:
    m = _moe(routing="skewed", capacity_factor=1.0)
    m(torch.randn(2, 16, 128))
    cap = 2 * 16 * 2 // 4
    assert max(m.last_counts.tolist()) <= cap
    assert sum(m.last_counts.tolist()) < 2 * 16 * 2  # some copies were dropped


def test_aux_loss_trains_the_router_without_changing_the_output() -> None:
    x = torch.randn(2, 16, 128)
    plain, aux = _moe(aux_loss_coeff=0.0), _moe(aux_loss_coeff=0.1)
    y0, y1 = plain(x), aux(x)
    assert torch.equal(y0, y1)
    y0.sum().backward()
    y1.sum().backward()
    assert not torch.allclose(plain.router.weight.grad, aux.router.weight.grad)
    assert torch.equal(plain.experts.w1.grad, aux.experts.w1.grad)


def test_aux_loss_is_one_coefficient_when_perfectly_balanced() -> None:
    """Switch loss E * sum_e f_e P_e is minimal (= 1) for uniform f and P."""
    m = _moe(aux_loss_coeff=1.0, routing="balanced")
    with torch.no_grad():
        m.router.weight.zero_()
    top, _, probs = m.route(torch.randn(32, 128), 16)
    assert m.aux_loss(top, probs, 2, 16).item() == pytest.approx(1.0)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_positions_cover_the_sequence_once_and_balance_causal_work(cp: int) -> None:
    s = 32
    parts = [cp_positions(s, cp, r) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(s))
    work = [int((p + 1).sum()) for p in parts]  # keys each query attends to under the causal mask
    assert len(set(work)) == 1
    with pytest.raises(ValueError):
        cp_positions(30, 4, 0)


def test_group_limited_routing_keeps_each_token_inside_its_best_groups() -> None:
    """8 experts in 4 groups of 2, top-4 inside the best 2 groups (Megatron group_limited_topk): a
    group's score is the sum of its top 4 / 2 = 2 probabilities, here both of its experts, so a token
    takes both experts of each of its two best groups; recomputed by hand from the router's logits."""
    from dataclasses import replace

    spec = get_preset("tiny-moe")
    spec = replace(spec, moe=replace(spec.moe, num_experts=8, top_k=4, router_groups=4, router_group_topk=2))
    torch.manual_seed(0)
    m = MoE(spec)
    torch.nn.init.normal_(m.router.weight, std=1.0)
    flat = torch.randn(64, spec.hidden_size)
    top, _, _ = m.route(flat, 64)
    pair_sums = torch.softmax(m.router(flat).float(), dim=-1).view(64, 4, 2).sum(-1)
    best = pair_sums.topk(2, dim=-1).indices
    for t in range(64):
        expected = sorted(2 * g + i for g in best[t].tolist() for i in (0, 1))
        assert sorted(int(e) for e in top[t]) == expected
    # without the limit some token picks an expert outside its two best groups
    free = MoE(replace(spec, moe=replace(spec.moe, router_groups=1, router_group_topk=1)))
    free.load_state_dict(m.state_dict())
    assert not torch.equal(free.route(flat, 64)[0].sort(-1).values, top.sort(-1).values)
