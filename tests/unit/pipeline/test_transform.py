"""Transformer: the executor window, and small default-collated batches collated on the loop
(the collate functions themselves: tests/unit/worker/test_collate.py)."""

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from asyncloader import AsyncLoader
from asyncloader.errors import AsyncLoaderError, LoaderTimeoutError


class RecordingSource:
    """Async map source of ``n`` uint8 arrays of ``size`` bytes (first byte: index % 251)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        await asyncio.sleep(0)
        return np.full(self.size, index % 251, dtype=np.uint8)


def collate_threads(monkeypatch, loader) -> tuple[list, set[str]]:
    """Runs one epoch; returns its batches and the names of the threads that collated."""
    import asyncloader._engines.engine as engine
    import asyncloader._pipeline.transform as transform

    names: set[str] = set()
    original_small, original_default = transform.collate_small, transform.default_collate

    def small(samples):
        names.add(threading.current_thread().name)
        return original_small(samples)

    monkeypatch.setattr(transform, "collate_small", small)
    # The thread path runs the plan's collate: torch's default_collate, recorded via run_batch
    # (the engine's on the transform thread, the Transformer's on the loop).
    original_run = transform.run_batch

    def run_batch(plan, *args):
        if plan is not None and plan.collate is original_default:
            names.add(threading.current_thread().name)
        return original_run(plan, *args)

    monkeypatch.setattr(transform, "run_batch", run_batch)
    monkeypatch.setattr(engine, "run_batch", run_batch)
    return list(loader), names


def test_small_batches_are_collated_on_the_loop_thread(monkeypatch):
    """Batches under 64 KiB with default collate never visit the transform thread."""
    batches, names = collate_threads(
        monkeypatch, AsyncLoader(RecordingSource(64, 1024), batch_size=8, io_concurrency=16)
    )
    assert names == {"asyncloader-loop"}
    assert torch.equal(torch.cat(batches)[:, 0], torch.arange(64, dtype=torch.uint8))


def test_large_batches_are_collated_off_the_loop(monkeypatch):
    """Batches of 64 KiB or more are collated in the transform thread, not on the loop."""
    batches, names = collate_threads(
        monkeypatch, AsyncLoader(RecordingSource(16, 32 * 1024), batch_size=4, io_concurrency=8)
    )
    assert names == {"asyncloader-transform_0"}
    assert torch.equal(torch.cat(batches)[:, 0], torch.arange(16, dtype=torch.uint8))


@pytest.mark.parametrize("option", ["transform", "collate_fn", "seed_per_sample"])
def test_no_inline_collate_with_a_transform_custom_collate_or_seeding(monkeypatch, option):
    """A transform, a user collate_fn, or per-sample seeding keeps collate off the loop."""
    seen: set[str] = set()

    def own_collate(samples):
        seen.add(threading.current_thread().name)
        return default_collate(samples)

    options = {
        "transform": {"transform": np.copy},
        "collate_fn": {"collate_fn": own_collate},
        "seed_per_sample": {"seed_per_sample": True},
    }[option]
    batches, names = collate_threads(
        monkeypatch,
        AsyncLoader(RecordingSource(16, 8), batch_size=4, io_concurrency=8, **options),
    )
    assert names | seen == {"asyncloader-transform_0"}
    assert len(batches) == 4


class CancellingExecutor(ThreadPoolExecutor):
    """Cancels batch 1's future before it runs, as ``shutdown(cancel_futures=True)`` (a pool
    shut down under a running epoch) cancels the batches queued in it."""

    def submit(self, fn, /, *args, **kwargs):
        if args[1] == 1:  # run_batch(plan, seq, ...)
            future: Future = Future()
            future.cancel()
            return future
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("iterate", ["for", "async for"])
def test_a_batch_the_engine_cancelled_fails_the_epoch(iterate):
    """An engine future cancelled by someone else (its pool shut down) ends the epoch with an
    error naming the batch; it is not taken for the epoch's own cancellation, which would
    leave that batch's turn, and its window permit, unfilled for ever."""
    with CancellingExecutor(1) as executor:
        loader = AsyncLoader(RecordingSource(8, 8), batch_size=2, executor=executor, timeout=5)
        with pytest.raises(AsyncLoaderError, match="batch 1") as raised:
            if iterate == "for":
                list(loader)
            else:

                async def consume() -> None:
                    async for _ in loader:
                        pass

                asyncio.run(consume())
        assert not isinstance(raised.value, LoaderTimeoutError)
        assert "cancelled" in str(raised.value)
