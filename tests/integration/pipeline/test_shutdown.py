"""Shutdown: break, close, an exception or GC leaves no worker process and no loader thread."""

import asyncio
import gc
import threading
import time
import warnings

import pytest

from asyncloader import AsyncLoader
from asyncloader._pipeline.sync_iterator import LoopThread
from tests.helpers import (
    AsyncSource,
    FailingSource,
    SyncSource,
    epoch_threads,
    loader_threads,
    worker_processes,
)
from tests.helpers.depth import scaled
from tests.helpers.sources import RELEASE_STUCK, STUCK_REACHED, StuckSource


@pytest.fixture
def clean():
    """Asserts that the test leaves the same threads and worker processes it found."""
    gc.collect()  # loaders of earlier tests left in reference cycles go now, not mid-test
    threads, procs = loader_threads(), worker_processes()
    yield
    assert worker_processes() == procs
    assert loader_threads() == threads


def test_one_hundred_breaks_mid_epoch_leave_nothing_behind(clean):
    """100 epochs broken off mid-way (25 at quick depth): each one's workers and threads are
    gone right after; the loader's loop thread, which its epochs share, goes with close()."""
    threads, procs = loader_threads(), worker_processes()
    epoch_before = epoch_threads()
    loader = AsyncLoader(SyncSource(400), batch_size=4, num_workers=2)
    for cycle in range(scaled(100)):
        for k, _ in enumerate(loader):
            if k == cycle % 5:
                break
        assert worker_processes() == procs, f"cycle {cycle}"
        assert epoch_threads() == epoch_before, f"cycle {cycle}"
    assert {t.name for t in loader_threads() - threads} == {"asyncloader-loop"}
    loader.close()


def test_close_mid_epoch_joins_everything(clean):
    """Closing the iterator (or the loader) mid-epoch stops and joins its workers and threads."""
    loader = AsyncLoader(AsyncSource(400), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    assert worker_processes(), "the epoch runs worker processes"
    it.close()
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    it2 = iter(loader)
    next(it2)
    loader.close()
    with pytest.raises(StopIteration):
        next(it2)


def test_an_error_then_closing_the_iterator_joins_everything(clean):
    """A sample's error leaves the epoch running (as DataLoader); closing it stops it all."""
    loader = AsyncLoader(FailingSource(100, bad=20), batch_size=4, num_workers=2)
    it = iter(loader)
    with pytest.raises(Exception, match="cannot read 20"):
        for _ in it:
            pass
    it.close()
    loader.close()


def test_dropping_the_iterator_is_enough(clean):
    """Garbage collection of a half-consumed iterator stops the epoch."""
    it = iter(AsyncLoader(SyncSource(400), batch_size=4, num_workers=2))
    next(it)
    del it
    gc.collect()


@pytest.mark.asyncio
async def test_async_break_then_aclose_joins_everything(clean):
    """`async with loader` + break: the epoch is cancelled and joined by aclose()."""
    async with AsyncLoader(AsyncSource(400), batch_size=4, num_workers=2) as loader:
        async for k, _ in _aenumerate(loader):
            if k == 3:
                break


@pytest.mark.asyncio
async def test_async_iterator_aclose_joins_everything(clean):
    """An explicitly closed async iterator stops its epoch; closing twice is fine."""
    loader = AsyncLoader(SyncSource(400), batch_size=4, num_workers=2)
    it = aiter(loader)
    await anext(it)
    await it.aclose()
    await it.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(it)


PLACEMENTS = [
    pytest.param({}, id="transforming"),
    pytest.param({"fetch_in_workers": True}, id="fetching"),
]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_an_iterator_closed_before_its_first_batch_reaps_the_workers_forked_at_iter(
    clean, placement
):
    """iter() forks the workers; closing the iterator at once (before the epoch's pump has
    begun, or after), or after state_dict(), leaves none: the epoch closes its unused pool."""
    loader = AsyncLoader(SyncSource(64), batch_size=4, num_workers=2, **placement)
    for cycle in range(20):
        it = iter(loader)
        if cycle % 2:
            loader.state_dict()
        it.close()
        assert not worker_processes(), f"cycle {cycle}: workers left after close()"
    loader.close()


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("end", ["drop", "aclose", "loader.close", "loader.aclose"])
@pytest.mark.asyncio
async def test_an_async_iterator_never_iterated_reaps_the_workers_forked_at_aiter(
    clean, placement, end
):
    """aiter() forks the workers; an iterator dropped or closed before its first batch, or
    its loader closed, shuts them down."""
    loader = AsyncLoader(SyncSource(64), batch_size=4, num_workers=2, **placement)
    it = aiter(loader)
    assert len(worker_processes()) == 2, "aiter() forks the workers"
    if end == "drop":
        del it
        gc.collect()
    elif end == "aclose":
        await it.aclose()
    elif end == "loader.close":
        loader.close()
    else:
        await loader.aclose()
    assert not worker_processes(), f"workers left after {end}"
    loader.close()


def test_a_job_cancelled_before_it_began_still_runs_its_finally():
    """The pump's ``finally`` (which closes the epoch and ends the stream) runs however
    early its Job is cancelled: at once, from the consumer's thread."""
    loop_thread = LoopThread()
    ran = []

    async def body():
        try:
            await asyncio.Event().wait()
        finally:
            ran.append(True)

    try:
        for _ in range(50):
            job = loop_thread.run(body())
            job.cancel()
            assert job.done.wait(10), "the cancelled job never finished"
        assert len(ran) == 50, f"the finally ran {len(ran)} times of 50"
    finally:
        loop_thread.stop()


def test_a_job_cancelled_twice_lets_the_cleanup_the_first_began_finish():
    """A second cancel (a timeout's, then close()'s) does not cut into the cleanup the first
    began: the pump's ``finally`` closes the epoch, and close() waits for all of it."""
    loop_thread = LoopThread()
    began, cleaning, release, ran = threading.Event(), threading.Event(), threading.Event(), []

    async def body():
        try:
            began.set()
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            await asyncio.to_thread(release.wait, 10)  # the epoch's closing: awaits of its own
            ran.append(True)

    try:
        job = loop_thread.run(body())
        assert began.wait(10)
        job.cancel()
        assert cleaning.wait(10), "the first cancel did not reach the job"
        job.cancel()
        release.set()
        assert job.done.wait(10), "the cancelled job never finished"
        assert ran == [True], "the second cancel interrupted the cleanup"
    finally:
        loop_thread.stop()


def test_persistent_workers_survive_epochs_and_close_stops_them(clean):
    """persistent_workers keeps the same processes across epochs; close() stops them."""
    before = worker_processes()
    loader = AsyncLoader(SyncSource(40), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    first = worker_processes() - before
    list(loader)
    assert len(first) == 2 and worker_processes() - before == first
    loader.close()
    loader.close()


def test_gc_of_an_unclosed_persistent_loader_warns_and_stops_workers(clean):
    """A persistent loader dropped without close() warns (ResourceWarning) and stops its pool."""
    loader = AsyncLoader(SyncSource(40), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del loader
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)


async def _aenumerate(ait):
    k = 0
    async for item in ait:
        yield k, item
        k += 1


@pytest.mark.filterwarnings("ignore:AsyncLoader with persistent_workers was never closed")
def test_an_iterator_keeps_its_loader_and_persistent_workers_alive(clean):
    """A loader referenced only by its iterator keeps its persistent workers until the end."""
    it = iter(AsyncLoader(SyncSource(40), batch_size=4, num_workers=2, persistent_workers=True))
    gc.collect()  # the loader object has no other reference
    assert sorted(i for b in it for i in b[:, 0].tolist()) == list(range(40))
    del it
    gc.collect()  # now the loader's finalizer stops the workers


@pytest.mark.timeout(60)
def test_a_collected_iterator_does_not_wait_for_its_epoch_under_the_thread_pools_lock():
    """A collection runs finalizers at any allocation, also one made under the lock every
    ThreadPoolExecutor.submit takes (it allocates its Future there), which the loop thread
    needs: the finalizer of an iterator only the collector can free must not wait there for
    its epoch (whose closing here also waits for a fetch stuck until released)."""
    from concurrent.futures import thread  # its private lock: the state the deadlock needs

    RELEASE_STUCK.clear()
    STUCK_REACHED.clear()
    loader = AsyncLoader(StuckSource(40, stuck=6, hold_s=20), batch_size=2)
    it = iter(loader)
    next(it)
    assert STUCK_REACHED.wait(10), "the fetch of sample 6 started"
    cycle: list = [it]
    cycle.append(cycle)  # only the collector can free the iterator now
    del it, cycle
    try:
        start = time.monotonic()
        with thread._global_shutdown_lock:
            gc.collect()
        inside = time.monotonic() - start
    finally:
        RELEASE_STUCK.set()
    loader.close()  # waits for the epoch, now that the fetch is released
    assert inside < 5, f"the collection waited {inside:.1f}s for the epoch to close"
