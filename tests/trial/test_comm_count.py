"""The byte-counting dispatch mode on a one-process gloo group: c10d and functional collectives,
input-buffer payloads (an all-gather's shard), attribution by the group's ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from autopar.trial.comm_count import CommBytesMode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:.*all_gather_into_tensor.*:FutureWarning")
def test_counts_payload_bytes_per_axis(one_rank_group) -> None:
    x = torch.ones(10, dtype=torch.float32)
    with CommBytesMode({frozenset({0}): "dp"}) as cb:
        dist.all_reduce(x)  # c10d: the whole buffer, 40 B
        out = torch.empty(10)
        dist.all_gather_into_tensor(out, x)  # input is this rank's shard: 40 B
        y = funcol.all_reduce(torch.ones(4, dtype=torch.float64), "sum", one_rank_group)  # funcol: 32 B
        funcol.wait_tensor(y)
        torch.add(x, 1)  # not a collective
    c = cb.count
    assert dict(c.bytes_by_axis) == {"dp": 40 + 40 + 32}
    assert c.calls_by_op["c10d.allreduce_"] == 1 and c.calls_by_op["c10d._allgather_base_"] == 1
    assert c.bytes_by_op["_c10d_functional.all_reduce"] == 32


def test_groups_of_no_axis_are_other(one_rank_group) -> None:
    with CommBytesMode({}) as cb:
        dist.all_reduce(torch.ones(3))
    assert dict(cb.count.bytes_by_axis) == {"other": 12}


def test_kind_keyed_entries_come_first(one_rank_group) -> None:
    """One rank set, two axes: all-to-alls go to the (kind, ranks) entry, other collectives to the
    plain entry (an EP group that is also the dp group)."""
    ranks = frozenset({0})
    with CommBytesMode({ranks: "dp", ("all_to_all", ranks): "ep"}) as cb:
        x = torch.ones(4)
        out = torch.empty(4)
        dist.all_to_all_single(out, x)
        dist.all_reduce(x)
    assert dict(cb.count.bytes_by_axis) == {"ep": 16, "dp": 16}
