"""Reused shared-memory batch segments (asyncloader._worker.buffers, on by default): a batch the
user keeps is never overwritten, segments are reused once released, the pool stays bounded
and lets its segments go when idle."""

from __future__ import annotations

import gc
import sys
import time
from typing import NamedTuple

import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader._worker import buffers
from asyncloader._worker.buffers import BufferPool, Pooled

pytestmark = pytest.mark.timeout(120)


#: Floats per sample: a batch of 4 is 1.5 MiB, above the size that travels by value.
WIDTH = 96 * 1024
BATCH = 4


class Pool(NamedTuple):
    """What a worker's pool was when it lent a batch's tensor."""

    segments: int  # how many it holds (-1: no pool)
    lent: bool  # the tensor is in one of them (else a fresh segment: none was free)


def filled_batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, Pool]:
    """A collate_fn that writes each sample's index over its row of a pooled batch tensor;
    returns it, the indices, and the pool's state."""
    out = buffers.batch_tensor((len(indices), WIDTH), torch.float32)
    for row, index in enumerate(indices):
        out[row].fill_(float(index))
    pool = buffers._pool
    if pool is None:
        return out, torch.tensor(indices), Pool(-1, False)
    held = out.untyped_storage().data_ptr()
    lent = any(slot.storage.data_ptr() == held for slot in pool._all)
    return out, torch.tensor(indices), Pool(len(pool._all), lent)


def check(batch: tuple[torch.Tensor, torch.Tensor, Pool]) -> None:
    images, indices, _ = batch
    expected = indices.to(torch.float32)[:, None].expand_as(images)
    assert torch.equal(images, expected), "a batch's contents changed after delivery"


def loader(n: int, **kwargs: object) -> AsyncLoader:
    return AsyncLoader(
        list(range(n)), batch_size=BATCH, num_workers=2, collate_fn=filled_batch, **kwargs
    )


def test_kept_batches_are_never_overwritten() -> None:
    """Every batch is kept to the end and every other one is dropped: those kept keep their
    contents, while the pool goes on lending the released ones."""
    kept = []
    for step, batch in enumerate(loader(BATCH * 60, prefetch=2)):
        check(batch)
        if step % 2 == 0:
            kept.append(batch)
    for batch in kept:
        check(batch)
    assert len(kept) == 30


def test_all_batches_kept_falls_back_to_fresh_segments() -> None:
    """Nothing is ever released: the pool fills to its bound and then every batch gets a
    fresh segment; all contents still hold."""
    batches = list(loader(BATCH * 40, prefetch=2))
    for batch in batches:
        check(batch)
    bound = 2 * 2 + 2  # the window (prefetch 2, 2 workers) + 2, per worker
    assert max(b[2].segments for b in batches) == bound
    assert not all(b[2].lent for b in batches)


@pytest.mark.parametrize("collector", ["on", "off"])
def test_segments_are_reused_once_released(collector: str) -> None:
    """Batches dropped at once: each worker lends the same few segments again and again, so
    every batch is in one of them. With the collector off too: no reference cycle of the
    loader's holds a batch the consumer dropped (one would leave the pools full and the
    later batches in fresh segments)."""
    was = gc.isenabled()
    if collector == "off":
        gc.disable()
    try:
        pools = []
        for batch in loader(BATCH * 80, prefetch=2):
            check(batch)
            pools.append(batch[2])
            del batch
    finally:
        if was:
            gc.enable()
    assert len(pools) == 80
    fresh = [k for k, pool in enumerate(pools) if not pool.lent]
    assert not fresh, f"batches {fresh} in fresh segments"
    assert max(pool.segments for pool in pools) <= 2 * 2 + 2


def test_persistent_workers_second_epoch() -> None:
    """A second epoch reuses the first's segments; contents hold in both."""
    load = loader(BATCH * 20, prefetch=2, persistent_workers=True)
    for _ in range(2):
        kept = list(load)
        for batch in kept:
            check(batch)
    load.close()


def test_storage_kept_alone_is_not_overwritten() -> None:
    """The user keeps each batch's storage object, not its tensor: still never reused."""
    kept = []
    for images, indices, _ in loader(BATCH * 30, prefetch=2):
        kept.append((images.untyped_storage(), images.shape, indices))
        del images
    for storage, shape, indices in kept:
        images = torch.empty(0).set_(storage, 0, shape)
        check((images, indices, 0))


def test_batches_kept_past_their_epoch() -> None:
    """Persistent workers: the first epoch's batches, kept through the second, keep their
    contents; once dropped, their segments serve the third epoch."""
    load = loader(BATCH * 20, prefetch=2, persistent_workers=True)
    first = list(load)
    second = [batch[2] for batch in load]
    for batch in first:
        check(batch)
    del first
    gc.collect()
    third = [batch[2] for batch in load]
    load.close()
    assert not all(pool.lent for pool in second)  # the pools were full of the first epoch's
    assert all(pool.lent for pool in third)


def _torch_segments(pid: int) -> int:
    """Shared-memory segments that process ``pid`` made with torch and maps (not those it
    inherited from the training process when forked: their names hold that one's pid)."""
    with open(f"/proc/{pid}/maps") as maps:
        return len({line.split()[-2] for line in maps if f"/torch_{pid}_" in line})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
def test_an_idle_pool_lets_its_segments_go() -> None:
    """Persistent workers between epochs: once idle for IDLE_S, each worker unmaps every
    segment of its pool that the consumer let go."""
    load = loader(BATCH * 20, prefetch=2, persistent_workers=True)
    iterator = iter(load)
    pids = [process.pid for process in iterator._workers]
    for batch in iterator:
        check(batch)
    del batch
    assert max(map(_torch_segments, pids)) > 0, "the pools held no segment during the epoch"
    deadline = time.monotonic() + 10 * buffers.IDLE_S
    while max(map(_torch_segments, pids)) and time.monotonic() < deadline:
        time.sleep(0.01)  # polls another process, which has no event to wait on
    remaining = list(map(_torch_segments, pids))
    second = [batch[2] for batch in load]  # the pools serve the next epoch again
    load.close()
    assert remaining == [0, 0], remaining
    assert len(second) == 20 and all(pool.lent for pool in second)


def test_segment_not_in_the_batch_is_given_back() -> None:
    """A collate that lends a segment and returns something else frees it at once."""
    pool = BufferPool(slots=1)
    pool.empty((BATCH, WIDTH), torch.float32)
    assert not pool._all[0].free
    assert not isinstance(pool.settle((torch.zeros(2),)), Pooled)
    assert pool._all[0].free
