"""Transformer: the executor window, and small default-collated batches collated on the loop
(the collate functions themselves: tests/test_collate.py)."""

import asyncio
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from asyncloader import AsyncLoader


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
