"""Bounded memory: a slow consumer never has more than the window of batches taken ahead."""

import asyncio
import math

import pytest

from asyncloader import AsyncLoader
from asyncloader._pipeline.epoch import Window
from tests.helpers import AsyncSource, SyncSource
from tests.helpers.waiting import wait_event


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_samples_fetched_never_exceed_consumed_plus_window(mode, num_workers):
    """After k batches reach the consumer, at most (k + window) batches were ever fetched."""
    src = AsyncSource(240)
    loader = AsyncLoader(src, batch_size=4, num_workers=num_workers, io_concurrency=8, prefetch=2)
    window = loader.stats.window
    assert window == 2 * max(1, num_workers) + math.ceil(8 / 4)
    excess = []

    def full(k):
        """All the pipeline may fetch with k batches consumed."""
        return min((k + window) * 4, src.n)

    def check(k):
        if src.calls.value > (k + window) * 4:
            excess.append((k, src.calls.value))

    what = "the pipeline to fetch as far ahead as it may"
    if mode == "sync":
        for k, _ in enumerate(loader, 1):
            src.calls.wait_for(full(k), what)
            check(k)
    else:

        async def run():
            k = 0
            async for _ in loader:
                k += 1
                await src.calls.await_for(full(k), what)
                check(k)

        asyncio.run(run())
    assert not excess
    assert loader.stats.max_ahead == window, "a slow consumer lets the pipeline fill the window"
    assert loader.stats.max_fetching <= 8


def test_workers_window_is_prefetch_per_worker():
    """With a sync source read in workers, the window is prefetch * num_workers and is reached."""
    loader = AsyncLoader(SyncSource(200), batch_size=2, num_workers=2, prefetch=3)
    for k, _ in enumerate(loader):
        if k == 0:  # held until the window fills (or the wait fails the test)
            wait_event(loader._last.ahead_reached(6), "the window to fill")
    assert loader.stats.window == 6
    assert loader.stats.max_ahead == 6


def test_io_concurrency_bounds_samples_in_flight_and_is_reached():
    """With plenty of latency, exactly io_concurrency samples are fetched at once, never more."""
    loader = AsyncLoader(AsyncSource(400), batch_size=4, io_concurrency=16)
    assert sum(1 for _ in loader) == 100
    assert loader.stats.max_fetching == 16


def test_an_event_tells_another_thread_when_the_window_reached_a_level():
    async def run():
        window = Window(3)
        two, early = window.reached(2), window.reached(1)
        await window.admit()
        assert early.is_set() and not two.is_set()
        await window.admit()
        assert two.is_set() and window.reached(2).is_set()  # already there: set at once
        assert not window.reached(3).is_set()

    asyncio.run(run())
