"""Fetcher with the real io tuner, on a virtual clock, over randomised schedules.

Each run draws an epoch from a seed: per-sample latencies (bursts, a change of regime
mid-epoch), failures and source-raised ``CancelledError`` (failing or skipped), a tuner whose
limit also jumps up and down at random, a window of batches in flight, and a consumer that is
slow, stalls, or breaks off mid-epoch. Every run must end within a bound computed from its
schedule, deliver every batch exactly once and in order, never fetch more than the limit
allows, and leave no runner behind. A failure names the seed that replays it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from asyncloader._base.failure import Failure
from asyncloader._base.skipping import Trimmed
from asyncloader._tuning.io_limit import FetchTuner
from asyncloader._worker.fetch import Fetcher
from tests.helpers.depth import scaled
from tests.helpers.schedules import Schedule, run_block
from tests.helpers.virtual_clock import VirtualClockLoop, deadline, virtual_time

RUNS = scaled(400)


class ChaosTuner(FetchTuner):
    """The real tuner, except that now and then the limit jumps where it would not go."""

    def __init__(self, rng: random.Random, cap: int, chaos: float) -> None:
        super().__init__(cap, budget=1 << 40, start=0.0)
        self._rng, self._chaos, self._top = rng, chaos, cap

    def completed(self, queued: bool, at: float, sample: object) -> int | None:
        if self._rng.random() < self._chaos:
            self.limit = self._rng.choice((1, 2, 3, 8, 64, 256, self._top))
            return self.limit
        return super().completed(queued, at, sample)


@dataclass
class Epoch:
    """One drawn epoch: the schedule and how it is driven."""

    schedule: Schedule
    batches: list[list[int]]
    window: int
    cap: int
    skip: bool
    chaos: float
    consumer_s: list[float]
    stop_at: int | None  # the consumer breaks off before taking this batch

    @classmethod
    def draw(cls, seed: int) -> Epoch:
        rng = random.Random(seed)
        samples = rng.randint(1, 1500)
        schedule = Schedule.draw(seed, samples)
        size = rng.choice((1, 3, 16, 64))
        order = list(range(samples))
        batches = [order[i : i + size] for i in range(0, samples, size)]
        slow = rng.choice((0.0, 0.0, 0.001, 0.05))
        consumer_s = [rng.expovariate(1 / slow) if slow else 0.0 for _ in batches]
        if rng.random() < 0.2:  # one long stall
            consumer_s[rng.randrange(len(batches))] += rng.uniform(0.5, 5.0)
        stop_at = rng.randrange(len(batches)) if rng.random() < 0.15 else None
        return cls(
            schedule,
            batches,
            window=rng.choice((1, 2, 8, 64)),
            cap=rng.choice((1, 4, 64, 4096)),
            skip=rng.random() < 0.3,
            chaos=rng.choice((0.0, 0.01, 0.1)),
            consumer_s=consumer_s,
            stop_at=stop_at,
        )

    def bound(self) -> float:
        return self.schedule.bound() + sum(self.consumer_s)

    def expected(self, seq: int) -> list[int] | type[Failure] | Trimmed:
        batch = self.batches[seq]
        bad = self.schedule.fails | self.schedule.cancels
        if not bad.intersection(batch):
            return batch
        if not self.skip:
            return Failure
        return Trimmed([i for i in batch if i not in bad], [])


def runner_tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks(loop) if t.get_name().startswith("fetch-runner")]


async def drive(epoch: Epoch, rng: random.Random) -> tuple[Fetcher | None, list[int], int]:
    """Runs the epoch as the loader's admission loop and consumer do; returns the fetcher,
    the seqs the consumer received, and the highest limit the fetch was allowed."""
    received: list[int] = []
    results: dict[int, object] = {}
    arrived = asyncio.Event()
    window = asyncio.Semaphore(epoch.window)
    tuner = ChaosTuner(rng, epoch.cap, epoch.chaos)
    limits = [tuner.limit]
    fetcher: Fetcher | None = None

    async def produce() -> None:
        nonlocal fetcher
        async with asyncio.TaskGroup() as tg:
            fetcher = Fetcher(
                epoch.schedule.get, epoch.cap, tg.create_task, epoch.skip, None, tuner,
                limits.append,
            )  # fmt: skip

            async def process(seq: int, indices: list[int]) -> None:
                results[seq] = await fetcher.fetch(seq, indices)
                arrived.set()

            for seq, indices in enumerate(epoch.batches):
                await window.acquire()
                tg.create_task(process(seq, indices), name=f"batch:{seq}")
            fetcher.close()

    producer = asyncio.create_task(produce(), name="producer")
    try:
        for seq in range(len(epoch.batches)):
            if seq == epoch.stop_at:
                break
            while seq not in results:
                arrived.clear()
                await arrived.wait()
            check_batch(epoch, seq, results.pop(seq))
            received.append(seq)
            window.release()
            if epoch.consumer_s[seq]:
                await asyncio.sleep(epoch.consumer_s[seq])
    finally:
        if epoch.stop_at is not None:
            producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
    return fetcher, received, max(limits)


def check_batch(epoch: Epoch, seq: int, got: object) -> None:
    want = epoch.expected(seq)
    if want is Failure:
        assert isinstance(got, Failure), f"batch {seq}: {got!r} instead of its failure"
    elif isinstance(want, Trimmed):
        assert isinstance(got, Trimmed) and got.batch == want.batch, f"batch {seq}: {got!r}"
    else:
        assert got == want, f"batch {seq}: {got!r} instead of {want!r}"


def simulate(seed: int) -> None:
    """One epoch drawn from ``seed``, checked against every invariant."""
    epoch = Epoch.draw(seed)
    rng = random.Random(seed ^ 0x5EED)
    with virtual_time(VirtualClockLoop()) as loop:

        async def main() -> tuple[Fetcher | None, list[int], int]:
            async with deadline(epoch.bound()):
                return await drive(epoch, rng)

        fetcher, received, top = loop.run_until_complete(main())
        left = runner_tasks(loop)
        assert not left, f"{len(left)} runners left after the epoch"
    full = len(epoch.batches) if epoch.stop_at is None else epoch.stop_at
    assert received == list(range(full))
    for seq in received:
        if epoch.expected(seq) is not Failure:  # the rest of a failed batch may go unfetched
            calls = [epoch.schedule.calls.get(i, 0) for i in epoch.batches[seq]]
            assert calls == [1] * len(calls), f"batch {seq} fetched {calls} times"
    if fetcher is None:  # the consumer left before the producer began
        assert epoch.stop_at == 0
        return
    assert fetcher.fetching == fetcher.active == fetcher.parked == 0, "left running or parked"
    assert fetcher.max_fetching <= top, f"{fetcher.max_fetching} fetching, limit at most {top}"


@pytest.mark.parametrize("block", range(4))
def test_every_epoch_ends_exactly_once_in_order_with_nothing_left(block):
    """Randomised schedules on a virtual clock: liveness, exactly-once, order, no leftovers."""
    run_block(simulate, block, 4, RUNS)
