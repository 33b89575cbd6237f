"""The device stage: order, the asyncloader-device thread, its bound, shutdown, CUDA safety."""

import asyncio
import gc
import threading
import time
import warnings
import weakref
from typing import ClassVar

import numpy as np
import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader._pipeline.device import DeviceStage
from tests.helpers import AsyncSource, SyncSource, indices_of, loader_threads
from tests.helpers.waiting import Count


class CustomBatch:
    """DataLoader's SimpleCustomBatch shape: a custom type with pin_memory() and to()."""

    calls: ClassVar[list] = []
    moved: ClassVar[Count] = Count()  # to() calls, for a test to wait on

    def __init__(self, samples):
        self.ids = torch.tensor([int(s[0]) for s in samples])

    def pin_memory(self):
        self.ids = self.ids.pin_memory()
        return self

    def to(self, device, non_blocking=False):
        CustomBatch.calls.append((int(self.ids[0]), threading.current_thread().name, non_blocking))
        CustomBatch.moved.add()
        self.ids = self.ids.to(device, non_blocking=non_blocking)
        return self


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_order_is_kept_through_the_device_thread(mode):
    """Out-of-order completion, device='cpu': batches still arrive in sampler order."""
    loader = AsyncLoader(AsyncSource(120), batch_size=6, device="cpu")
    if mode == "sync":
        got = indices_of(loader)
    else:

        async def run():
            return indices_of([b async for b in loader])

        got = asyncio.run(run())
    assert got == list(range(120))


def test_custom_to_runs_once_per_batch_on_the_device_thread():
    """A custom batch's to() is called exactly once per batch, on asyncloader-device."""
    CustomBatch.calls.clear()
    batches = list(AsyncLoader(SyncSource(40), batch_size=4, collate_fn=CustomBatch, device="cpu"))
    assert [b.ids.tolist() for b in batches] == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    assert sorted(first for first, _, _ in CustomBatch.calls) == list(range(0, 40, 4))
    assert {name for _, name, _ in CustomBatch.calls} == {"asyncloader-device"}
    assert all(non_blocking for _, _, non_blocking in CustomBatch.calls)


def test_device_thread_runs_at_most_two_batches_ahead():
    """With a consumer that waits for the device thread to move all it may (consumed + 2
    batches, 20 in all), it has never moved more."""
    CustomBatch.calls.clear()
    CustomBatch.moved.reset()
    loader = AsyncLoader(SyncSource(80), batch_size=4, collate_fn=CustomBatch, device="cpu")
    excess = []
    for k, _ in enumerate(loader, 1):
        moved = min(k + 2, 20)
        CustomBatch.moved.wait_for(moved, f"{moved} batches moved")
        if len(CustomBatch.calls) > k + 2:
            excess.append((k, len(CustomBatch.calls)))
    assert not excess
    assert loader.stats.max_ahead <= loader.stats.window


def test_pin_memory_without_cuda_warns_once_and_passes_batches_through():
    """pin_memory=True on a CPU-only machine is a warning at construction, not an error."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: pinning really happens")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = AsyncLoader(SyncSource(12), batch_size=4, pin_memory=True)
        got = indices_of(loader)
    assert got == list(range(12))
    pins = [w for w in caught if "pin_memory" in str(w.message)]
    assert [str(w.message) for w in pins] == [
        "pin_memory=True but CUDA is not available: batches are passed through unpinned"
    ]
    assert pins[0].filename == __file__  # points at the user's line, not asyncloader's


def test_cuda_device_without_cuda_is_a_value_error():
    """Asking for a CUDA device on a machine without one fails in the constructor."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        AsyncLoader(SyncSource(4), device="cuda")


def test_device_thread_is_joined_on_break_and_on_error():
    """Breaking off, or errors in the device stage, leave no asyncloader-device thread."""
    before = loader_threads()
    for k, _ in enumerate(AsyncLoader(SyncSource(100), batch_size=4, device="cpu")):
        if k == 2:
            break
    assert loader_threads() == before

    class Unmovable:
        def __init__(self, samples):
            pass

        def to(self, device, non_blocking=False):
            raise RuntimeError("cannot move")

    loader = AsyncLoader(SyncSource(8), batch_size=4, collate_fn=Unmovable, device="cpu")
    it = iter(loader)
    for seq in range(2):  # each batch fails on its own; the epoch goes on
        with pytest.raises(RuntimeError, match="cannot move") as info:
            next(it)
        indices = list(range(4 * seq, 4 * seq + 4))
        assert f"asyncloader: stage=device batch={seq} indices={indices}" in info.value.__notes__
    with pytest.raises(StopIteration):
        next(it)
    loader.close()
    assert loader_threads() == before


class ArrayDataset:
    """Deterministic float samples, large enough that copies take measurable time."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return np.full(self.size, index, dtype=np.float32)


@pytest.mark.cuda
def test_cuda_values_survive_the_allocator_reuse_race():
    """1000 batches: each on-device batch equals its host values while kernels run on it."""
    loader = AsyncLoader(ArrayDataset(4000, 1 << 16), batch_size=4, pin_memory=True, device="cuda")
    for k, batch in enumerate(loader):
        work = batch * 2.0  # a kernel on the consumer's stream reading the batch
        expected = torch.arange(4 * k, 4 * k + 4, device="cuda", dtype=torch.float32)
        assert torch.equal(work[:, 0] / 2.0, expected) and torch.equal(work[:, -1] / 2.0, expected)
        del batch, work  # dropped at once: its block may be reused by the next copy
    assert k == 999


@pytest.mark.cuda
def test_cuda_copies_overlap_with_compute():
    """While the consumer computes, the next batch is copied: its wait is shorter than a copy."""
    floats = 1 << 20  # 4 MiB per sample, 32 MiB per batch
    loader = AsyncLoader(ArrayDataset(64, floats), batch_size=8, pin_memory=True, device="cuda")
    host = torch.zeros(8, floats).pin_memory()
    torch.cuda.synchronize()
    start = time.perf_counter()
    host.to("cuda")
    torch.cuda.synchronize()
    copy_s = time.perf_counter() - start
    waits = []
    it = iter(loader)
    next(it)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(6):
        for _ in range(40):
            x = x @ x / 4096  # a training step's compute, while the next batch is copied
        torch.cuda.synchronize()
        start = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - start)
    it.close()
    assert sorted(waits)[len(waits) // 2] < copy_s


@pytest.mark.cuda
def test_cuda_batch_is_freed_when_dropped_without_the_collector():
    """A batch handed over on the GPU is freed as soon as the consumer drops it: nothing of the
    loader's holds it in a reference cycle (the collector is off here)."""
    was = gc.isenabled()
    gc.disable()
    try:
        loader = AsyncLoader(ArrayDataset(64, 1 << 10), batch_size=4, device="cuda")
        alive = []
        for batch in loader:
            alive.append(weakref.ref(batch))
            del batch
        left = [k for k, ref in enumerate(alive) if ref() is not None]
    finally:
        if was:
            gc.enable()
    assert len(alive) == 16 and not left, f"batches {left} still alive"


def test_a_device_thread_whose_stream_fails_fails_each_batch_instead_of_hanging(monkeypatch):
    """The device thread's set-up failing (an invalid CUDA ordinal, a broken driver) fails
    each move with its error: no move waits for a thread that is gone."""

    def broken(device):
        raise RuntimeError("invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "set_device", broken)
    stage = DeviceStage(False, torch.device("cuda", 7))

    async def move():
        return await asyncio.wait_for(stage.move(torch.zeros(2)), 10)

    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="invalid device ordinal"):
                asyncio.run(move())
    finally:
        stage.close()
