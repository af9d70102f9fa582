"""Group-limited (DeepSeek-V3: node-limited) routing in the deduplicated dispatch's network copies
(autopar.cost.collectives.remote_nodes_per_token), against a hand derivation, a simulation of
Megatron's group_limited_topk on random router scores, and the issue's 1.31x over-count."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autopar.cost.collectives import remote_nodes_per_token
from autopar.errors import InputError
from autopar.spec.presets import get_preset


def test_deepseek_v3_at_ep64_reaches_three_and_a_half_remote_nodes() -> None:
    """8 groups on 8 nodes, 4 chosen: a given other node is hit when its group is one of the 4,
    P = 1 - C(7, 4) / C(8, 4) = 1/2, so 7 x 1/2 = 3.5 remote nodes; without the limit
    7 x (1 - (7/8)^8) = 4.59, 1.31x as many."""
    m = get_preset("deepseek-v3").moe
    limited = remote_nodes_per_token(np.array([8.0]), m.top_k, m.router_groups, m.router_group_topk, m.num_experts)
    free = remote_nodes_per_token(np.array([8.0]), m.top_k)
    assert limited[0] == pytest.approx(3.5)
    assert free[0] == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert free[0] / limited[0] == pytest.approx(1.31, abs=0.005)


def test_two_groups_per_node_and_two_nodes_per_group() -> None:
    m = get_preset("deepseek-v3").moe
    args = (m.top_k, m.router_groups, m.router_group_topk, m.num_experts)
    # EP32 on 4 nodes: 2 groups per node, a node hit unless both are left out: 1 - C(6, 4) / C(8, 4)
    assert remote_nodes_per_token(np.array([4.0]), *args)[0] == pytest.approx(3 * (1 - 15 / 70))
    # EP128 on 16 nodes: a group over 2 nodes, chosen with 4/8, its 8/4 = 2 copies on either node
    assert remote_nodes_per_token(np.array([16.0]), *args)[0] == pytest.approx(15 * 0.5 * (1 - 0.5**2))
    assert remote_nodes_per_token(np.array([1.0]), *args)[0] == 0.0
    # 3 nodes: groups not aligned with nodes, the limit is not priced
    assert remote_nodes_per_token(np.array([3.0]), *args)[0] == pytest.approx(2 * (1 - (2 / 3) ** 8))


def test_a_simulation_of_megatrons_group_limited_topk_agrees() -> None:
    """Random router scores through Megatron's rule (group score: the sum of its top k/M scores; the
    top M groups; the top k experts inside them), 256 experts on 8 nodes of 32: the mean number of
    other nodes a token reaches, for tokens spread evenly over the nodes."""
    rng = np.random.default_rng(0)
    tokens, experts, groups, m, k, nodes = 20000, 256, 8, 4, 8, 8
    scores = rng.random((tokens, experts))
    group_scores = np.sort(scores.reshape(tokens, groups, -1), axis=-1)[:, :, -k // m :].sum(-1)
    chosen = np.argsort(-group_scores, axis=-1)[:, :m]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, chosen, True, axis=1)
    masked = np.where(np.repeat(mask, experts // groups, axis=1), scores, -np.inf)
    top = np.argsort(-masked, axis=-1)[:, :k]
    hit = np.zeros((tokens, nodes), dtype=bool)
    np.put_along_axis(hit, top // (experts // nodes), True, axis=1)
    home = np.arange(tokens) % nodes
    remote = hit.sum(1) - hit[np.arange(tokens), home]
    assert remote.mean() == pytest.approx(3.5, abs=0.05)


def test_router_groups_are_checked() -> None:
    """A model whose groups do not split its experts evenly, or that picks more groups than it has or
    a number that does not divide top_k, is refused with the field named (autopar.spec.model)."""
    spec = get_preset("deepseek-v3")
    with pytest.raises(InputError, match=r"router_groups \(7\) must divide moe.num_experts \(256\)"):
        replace(spec, moe=replace(spec.moe, router_groups=7))
    with pytest.raises(InputError, match=r"router_group_topk \(3\) must be at most"):
        replace(spec, moe=replace(spec.moe, router_group_topk=3))
