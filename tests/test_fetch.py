"""Fetcher: the io_concurrency bound, order of samples in a batch, failures."""

import asyncio

import pytest

from asyncloader._failure import Failure
from asyncloader._fetch import Fetcher


class Gate:
    """An async getter that records concurrency and releases fetches when told."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.open = asyncio.Event()

    async def get(self, index: int) -> int:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self.open.wait()
            if index == 13:
                raise LookupError("no 13")
            return index * 10
        finally:
            self.active -= 1


@pytest.mark.asyncio
async def test_never_more_than_io_concurrency_fetches_at_once():
    """With all fetches held open, exactly io_concurrency of them are in flight."""
    gate = Gate()
    fetcher = Fetcher(gate.get, io_concurrency=5)
    batches = [asyncio.create_task(fetcher.fetch(s, list(range(s * 4, s * 4 + 4)))) for s in (0, 1)]
    while gate.active < 5:
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    assert gate.active == 5 and fetcher.fetching == 5
    gate.open.set()
    results = await asyncio.gather(*batches)
    assert results == [[0, 10, 20, 30], [40, 50, 60, 70]]
    assert gate.peak == 5 and fetcher.max_fetching == 5 and fetcher.fetching == 0


@pytest.mark.asyncio
async def test_a_failing_sample_returns_a_failure_naming_it():
    """One failing sample turns the batch into a Failure naming stage, batch and index."""
    gate = Gate()
    gate.open.set()
    result = await Fetcher(gate.get, io_concurrency=8).fetch(3, [12, 13, 14])
    assert isinstance(result, Failure)
    assert isinstance(result.exc, LookupError)
    assert "asyncloader: stage=fetch batch=3 index=13 indices=[12, 13, 14]" in result.exc.__notes__
