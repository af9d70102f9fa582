"""The tensor-memory tracker (autopar.trial.memory): storages resized in place (FSDP2's way of
freeing and re-gathering its unsharded parameters) and garbage left in reference cycles by an
earlier trial are accounted as they are, not as they were created."""

from __future__ import annotations

import gc

import torch

from autopar.trial.memory import PeakMemory, TensorPeak


def test_resized_storages_are_followed() -> None:
    with TensorPeak([]) as tracker:
        t = torch.empty(1000)  # 4000 bytes
        assert tracker.current == 4000
        t.untyped_storage().resize_(0)  # FSDP2 free_storage
        assert tracker.current == 0
        t.untyped_storage().resize_(8000)  # FSDP2 alloc_storage
        assert tracker.current == 8000 and tracker.peak == 8000
        del t
        gc.collect()
        assert tracker.current == 0


def test_patch_is_removed_on_exit() -> None:
    original = torch.UntypedStorage.resize_
    with TensorPeak([]):
        assert torch.UntypedStorage.resize_ is not original
    assert torch.UntypedStorage.resize_ is original


def test_cyclic_garbage_of_an_earlier_trial_is_not_counted(monkeypatch) -> None:
    monkeypatch.setenv("AUTOPAR_TENSOR_MEMORY", "1")

    class Holder:
        pass

    a, b = Holder(), Holder()
    a.other, b.other, a.t = b, a, torch.empty(1 << 20)  # 4 MiB held only by a reference cycle
    del a, b
    mem = PeakMemory(torch.device("cpu"))
    mem.reset()
    peak, delta, method = mem.peak()
    assert method == "tensor-peak"
    assert peak < 1 << 20  # the cycle was collected before the window started
