"""Fetcher: the io_concurrency bound, order of samples in a batch, failures, runner lifetime."""

import asyncio
import contextlib

import pytest

from asyncloader._base.failure import Failure
from asyncloader._worker.fetch import Fetcher
from asyncloader.errors import AsyncLoaderError


class Gate:
    """An async getter that records calls and concurrency and releases fetches when told."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.calls: list[int] = []
        self.open = asyncio.Event()
        self._entered = asyncio.Condition()

    async def active_reaches(self, n: int) -> None:
        """Returns once ``n`` fetches are held in the gate at once."""
        async with self._entered:
            await self._entered.wait_for(lambda: self.active >= n)

    async def get(self, index: int) -> int:
        self.calls.append(index)
        self.active += 1
        self.peak = max(self.peak, self.active)
        async with self._entered:
            self._entered.notify_all()
        try:
            await self.open.wait()
            if index == 13:
                raise LookupError("no 13")
            if index == 99:
                raise asyncio.CancelledError("a client's own timeout")
            return index * 10
        finally:
            self.active -= 1


@contextlib.asynccontextmanager
async def running(get, io_concurrency: int):
    """A Fetcher whose runners live in a TaskGroup, closed (so they end) on the way out."""
    async with asyncio.TaskGroup() as tg:
        fetcher = Fetcher(get, io_concurrency, tg.create_task)
        try:
            yield tg, fetcher
        finally:
            fetcher.close()


@pytest.mark.asyncio
async def test_never_more_than_io_concurrency_fetches_at_once():
    """With all fetches held open, exactly io_concurrency of them are in flight."""
    gate = Gate()
    async with running(gate.get, 5) as (tg, fetcher):
        batches = [tg.create_task(fetcher.fetch(s, list(range(s * 4, s * 4 + 4)))) for s in (0, 1)]
        await gate.active_reaches(5)
        assert gate.active == 5 and fetcher.fetching == 5
        gate.open.set()
        results = await asyncio.gather(*batches)
    assert results == [[0, 10, 20, 30], [40, 50, 60, 70]]
    assert gate.peak == 5 and fetcher.max_fetching == 5 and fetcher.fetching == 0


def runner_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("fetch-runner")]


@pytest.mark.asyncio
async def test_runners_are_reused_across_batches_and_end_after_close():
    """Idle runners park and serve the next batch (no task per sample); close() ends them."""
    gate = Gate()
    gate.open.set()
    spawned = []
    async with asyncio.TaskGroup() as tg:

        def spawn(coro, name):
            spawned.append(name)
            return tg.create_task(coro, name=name)

        fetcher = Fetcher(gate.get, 4, spawn)
        for seq in range(10):
            assert await fetcher.fetch(seq, [seq, seq + 1, seq + 2]) == [
                10 * seq,
                10 * seq + 10,
                10 * seq + 20,
            ]
        assert len(spawned) == 3 and len(runner_tasks()) == 3, "parked, not ended"
        fetcher.close()
    assert runner_tasks() == [] and fetcher.active == fetcher.parked == 0


@pytest.mark.asyncio
async def test_earlier_batches_are_fetched_first():
    """Samples are fetched in the order their batches were queued (FIFO across batches)."""
    gate = Gate()
    gate.open.set()
    async with running(gate.get, 1) as (tg, fetcher):
        tasks = [tg.create_task(fetcher.fetch(s, [s * 10, s * 10 + 1])) for s in range(4)]
        await asyncio.gather(*tasks)
    assert gate.calls == [0, 1, 10, 11, 20, 21, 30, 31]


@pytest.mark.asyncio
async def test_a_failing_sample_returns_a_failure_naming_it():
    """One failing sample turns the batch into a Failure naming stage, batch and index."""
    gate = Gate()
    gate.open.set()
    async with running(gate.get, 8) as (_, fetcher):
        result = await fetcher.fetch(3, [12, 13, 14])
    assert isinstance(result, Failure)
    assert isinstance(result.exc, LookupError)
    assert "asyncloader: stage=fetch batch=3 index=13 indices=[12, 13, 14]" in result.exc.__notes__


@pytest.mark.asyncio
async def test_after_a_failure_the_rest_of_the_batch_is_not_fetched():
    """Queued samples of a failed batch are skipped; the next batch is still served."""
    gate = Gate()
    gate.open.set()
    async with running(gate.get, 1) as (tg, fetcher):
        failed = tg.create_task(fetcher.fetch(0, [13, 14, 15]))
        ok = tg.create_task(fetcher.fetch(1, [1, 2]))
        assert isinstance(await failed, Failure)
        assert await ok == [10, 20]
    assert gate.calls == [13, 1, 2]


@pytest.mark.asyncio
async def test_a_source_raising_cancelled_error_fails_its_batch_instead_of_hanging():
    """A CancelledError from the source (not a cancellation of the epoch) is a sample failure."""
    gate = Gate()
    gate.open.set()
    async with running(gate.get, 4) as (_, fetcher):
        result = await asyncio.wait_for(fetcher.fetch(2, [98, 99]), 10)
        assert await fetcher.fetch(3, [1]) == [10]
    assert isinstance(result, Failure) and isinstance(result.exc, AsyncLoaderError)
    assert "index=99" in result.exc.__notes__[0]


@pytest.mark.asyncio
async def test_a_cancelled_fetch_drops_its_queued_samples():
    """Cancelling one batch's fetch leaves its queued samples unfetched; others complete."""
    gate = Gate()
    async with running(gate.get, 1) as (tg, fetcher):
        first = tg.create_task(fetcher.fetch(0, [1]))
        dropped = tg.create_task(fetcher.fetch(1, [2, 3]))
        kept = tg.create_task(fetcher.fetch(2, [4]))
        await gate.active_reaches(1)
        dropped.cancel()
        await asyncio.wait({dropped})
        gate.open.set()
        assert await first == [10] and await kept == [40]
    assert dropped.cancelled()
    assert gate.calls == [1, 4]


@pytest.mark.asyncio
async def test_cancelling_the_task_group_stops_runners_mid_fetch():
    """An epoch's cancellation reaches runners blocked in a fetch; none is left behind."""
    gate = Gate()

    async def epoch() -> None:
        async with asyncio.TaskGroup() as tg:
            fetcher = Fetcher(gate.get, 3, tg.create_task)
            tg.create_task(fetcher.fetch(0, list(range(10))))

    task = asyncio.create_task(epoch())
    await gate.active_reaches(3)
    assert gate.active == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.active == 0 and runner_tasks() == []
