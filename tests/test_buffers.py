"""Reused shared-memory batch segments (asyncloader._worker.buffers): a batch the user keeps is
never overwritten, segments are reused once released, and the pool stays bounded."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader._worker import buffers, plan
from asyncloader._worker.buffers import BufferPool, Pooled

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker keeps up to prefetch + 2 segments (the pools are off by default)."""
    made = plan.BatchPlan.of.__func__
    monkeypatch.setattr(
        plan.BatchPlan,
        "of",
        classmethod(
            lambda cls, options: dataclasses.replace(
                made(cls, options), buffers=options.prefetch + 2
            )
        ),
    )


#: Floats per sample: a batch of 4 is 1.5 MiB, above the size that travels by value.
WIDTH = 96 * 1024
BATCH = 4


def filled_batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A collate_fn that writes each sample's index over its row of a pooled batch tensor;
    returns it, the indices, and how many segments this worker's pool holds."""
    out = buffers.batch_tensor((len(indices), WIDTH), torch.float32)
    for row, index in enumerate(indices):
        out[row].fill_(float(index))
    pool = buffers._pool
    return out, torch.tensor(indices), len(pool._all) if pool is not None else -1


def check(batch: tuple[torch.Tensor, torch.Tensor, int]) -> None:
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
    bound = 2 + 2  # prefetch_bound + 2, per worker
    assert max(b[2] for b in batches) == bound


def test_segments_are_reused_once_released() -> None:
    """Batches dropped at once: each worker lends the same few segments again and again."""
    seen = []
    for batch in loader(BATCH * 80, prefetch=2):
        check(batch)
        seen.append(batch[2])
        del batch
    assert len(seen) == 80
    assert max(seen) <= 4, seen  # 40 batches per worker from at most 4 segments


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
    assert max(second + third) <= 4


def test_segment_not_in_the_batch_is_given_back() -> None:
    """A collate that lends a segment and returns something else frees it at once."""
    pool = BufferPool(slots=1)
    pool.empty((BATCH, WIDTH), torch.float32)
    assert not pool._all[0].free
    assert not isinstance(pool.settle((torch.zeros(2),)), Pooled)
    assert pool._all[0].free
