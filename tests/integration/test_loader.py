"""AsyncLoader end to end: sources, samplers, collate, epochs (order, exactly-once, window,
shutdown and resume over every kind of source: tests/integration/test_contracts.py)."""

import asyncio
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from asyncloader import AsyncLoader, get_worker_info
from tests.helpers import (
    AsyncIterSource,
    AsyncSource,
    IterSource,
    SyncSource,
    add_one,
    indices_of,
)


def collect(loader, mode):
    """All batches of one epoch, through `for` (sync) or `async for` (async)."""
    if mode == "sync":
        return list(loader)

    async def run():
        return [batch async for batch in loader]

    return asyncio.run(run())


MODES = ["sync", "async"]
SOURCES = [SyncSource, AsyncSource]


@pytest.mark.parametrize("mode", MODES)
def test_out_of_order_really_happens_with_in_order_false(mode):
    """in_order=False releases batches as they complete, which differs from sampler order."""

    class Slow0(AsyncSource):
        """Batch 0's samples arrive only after sample 63, of batch 15, has been fetched."""

        def __init__(self, n):
            super().__init__(n)
            self.last_fetched = None

        async def __getitem__(self, index):
            if self.last_fetched is None:  # made on the loop the fetches run on
                self.last_fetched = asyncio.Event()
            if index < 4:
                await self.last_fetched.wait()
            sample = await super().__getitem__(index)
            if index == 63:
                self.last_fetched.set()
            return sample

    loader = AsyncLoader(Slow0(64), batch_size=4, in_order=False)
    got = indices_of(collect(loader, mode))
    assert sorted(got) == list(range(64))
    assert got[:4] != [0, 1, 2, 3]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_exactly_once(source, num_workers, in_order, drop_last):
    """The multiset of delivered indices equals the sampler's, for every combination."""
    perm = list(range(101))
    random.Random(1).shuffle(perm)
    loader = AsyncLoader(
        source(101),
        batch_size=10,
        sampler=perm,
        num_workers=num_workers,
        in_order=in_order,
        drop_last=drop_last,
    )
    expected = perm[:100] if drop_last else perm
    got = indices_of(loader)
    assert Counter(got) == Counter(expected)
    if in_order:
        assert got == expected
    assert loader.stats.batches == len(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_batches_as_dataloader_with_the_same_generator(num_workers):
    """With equal generator seeds, shuffled batches equal DataLoader's, value for value."""
    ds = SyncSource(50)
    theirs = list(
        DataLoader(ds, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(5))
    )
    ours = list(
        AsyncLoader(
            ds,
            batch_size=7,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(5),
        )
    )
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_each_iteration_is_a_new_epoch():
    """Iterating again delivers every sample again, reshuffled."""
    loader = AsyncLoader(AsyncSource(40), batch_size=4, shuffle=True)
    first, second = indices_of(loader), indices_of(loader)
    assert sorted(first) == sorted(second) == list(range(40))
    assert first != second


def test_iterable_drop_last_and_unbatched():
    """drop_last drops the tail of a stream; batch_size=None yields samples one by one."""
    assert indices_of(AsyncLoader(IterSource(53), batch_size=5, drop_last=True)) == list(range(50))
    samples = list(AsyncLoader(AsyncIterSource(5), batch_size=None))
    assert [int(s[0]) for s in samples] == list(range(5))
    assert all(isinstance(s, torch.Tensor) and s.shape == (3,) for s in samples)


def test_plain_generator_function_iterable():
    """Any object with __iter__ (not a torch IterableDataset) is an iterable source."""

    class Squares:
        def __iter__(self):
            return iter(range(10))

    batches = list(AsyncLoader(Squares(), batch_size=4))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unbatched_map_source_matches_dataloader(num_workers):
    """batch_size=None yields single samples converted as DataLoader converts them."""
    ds = SyncSource(6)
    ours = list(AsyncLoader(ds, batch_size=None, num_workers=num_workers))
    theirs = list(DataLoader(ds, batch_size=None))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_distributed_sampler_ranks_partition_the_dataset():
    """DistributedSampler works unchanged; its ranks together cover every sample once."""
    ds = SyncSource(40)
    got = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        got += indices_of(AsyncLoader(ds, batch_size=4, sampler=sampler))
    assert sorted(got) == list(range(40))


def test_batch_sampler_is_used_as_given():
    """A batch_sampler's lists of indices become the batches."""
    groups = [[3, 1], [0], [2, 4, 5]]
    batches = list(AsyncLoader(SyncSource(6), batch_sampler=groups))
    assert [b[:, 0].tolist() for b in batches] == groups


@dataclass
class Pair:
    """A custom batch type returned by a collate_fn."""

    ids: list
    total: int


def pair_collate(samples):
    return Pair([int(s[0]) for s in samples], int(sum(s.sum() for s in samples)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_fn_and_transform_run_and_may_return_custom_types(num_workers):
    """transform runs on each sample, then collate_fn builds whatever batch type it returns."""
    loader = AsyncLoader(
        SyncSource(9),
        batch_size=3,
        transform=add_one,
        collate_fn=pair_collate,
        num_workers=num_workers,
    )
    batches = list(loader)
    assert all(isinstance(b, Pair) for b in batches)
    assert [b.ids for b in batches] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_nested_samples_collate_like_dataloader():
    """Dict samples collate into dicts of batched tensors, as default_collate does."""

    class Dicts(SyncSource):
        def __getitem__(self, index):
            return {"x": np.full(2, index), "y": index}

    ours = list(AsyncLoader(Dicts(8), batch_size=4))
    theirs = list(DataLoader(Dicts(8), batch_size=4))
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])


def test_user_executor_runs_transform_and_collate():
    """executor= replaces the built-in pool; transform and collate run on its threads."""
    seen = set()

    def mark(x):
        seen.add(threading.current_thread().name)
        return x

    with ThreadPoolExecutor(2, thread_name_prefix="user-pool") as pool:
        got = indices_of(AsyncLoader(AsyncSource(30), batch_size=5, transform=mark, executor=pool))
    assert got == list(range(30))
    assert seen and all(name.startswith("user-pool") for name in seen)


def worker_ids(samples):
    info = get_worker_info()
    return [(info.id, info.num_workers, info.seed) for _ in samples]


def test_get_worker_info_in_workers_and_none_outside():
    """Inside a worker get_worker_info() names it; outside it is None."""
    assert get_worker_info() is None
    loader = AsyncLoader(
        SyncSource(40),
        batch_size=2,
        num_workers=2,
        collate_fn=worker_ids,
        generator=torch.Generator().manual_seed(0),
    )
    infos = {row for batch in loader for row in batch}
    ids = {i for i, _, _ in infos}
    assert ids <= {0, 1} and ids
    assert {n for _, n, _ in infos} == {2}
    seeds = {i: s for i, _, s in infos}
    assert len(set(seeds.values())) == len(seeds)


def test_sync_getitem_never_runs_on_the_event_loop():
    """A sync __getitem__ that waits for the loop to make progress does not deadlock it."""

    class NeedsLoop(SyncSource):
        def __init__(self, n, flag):
            super().__init__(n)
            self.flag = flag

        def __getitem__(self, index):
            if not self.flag.wait(timeout=30):
                raise AssertionError("the event loop was blocked")
            return super().__getitem__(index)

    async def run():
        flag = threading.Event()
        loader = AsyncLoader(NeedsLoop(8, flag), batch_size=4)
        asyncio.get_running_loop().call_soon(flag.set)  # runs only if the loop is free
        return [b async for b in loader]

    assert indices_of(asyncio.run(run())) == list(range(8))
