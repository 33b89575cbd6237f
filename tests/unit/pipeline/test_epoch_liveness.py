"""Whole epochs of the loader, on a virtual clock, over randomised schedules.

The loader as users run it with an async map-style source and no workers (``async for`` on
the caller's loop), every option at its default unless the draw changes it: latencies with
bursts and a change of regime, failing and skipped samples, source-raised ``CancelledError``,
a slow or stalling consumer, ``break`` and ``aclose()`` mid-epoch, ``state_dict()`` and a
resume in a second loader, and second epochs. Every run must end within a bound computed from
its schedule (a hang raises :class:`~tests.helpers.virtual_clock.Stuck` at once), deliver
every sample exactly once and in order (or raise the source's own error at the first failing
batch), and leave no task behind. A failure names the seed that replays it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import pytest

from asyncloader import AsyncLoader
from tests.helpers.depth import scaled
from tests.helpers.schedules import Schedule, run_block
from tests.helpers.virtual_clock import VirtualClockLoop, deadline, virtual_time

RUNS = scaled(160)


class ScheduledSource:
    """An async map-style dataset whose samples cost what the schedule says."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def __len__(self) -> int:
        return len(self.schedule.latency)

    async def __getitem__(self, index: int) -> int:
        return await self.schedule.get(index)


@dataclass
class Run:
    """One drawn run: the schedule, the loader's options and what the consumer does."""

    seed: int
    schedule: Schedule
    options: dict
    consumer_s: float
    stall: tuple[int, float] | None
    stop_at: int | None  # batches taken before the consumer stops
    stop: str  # "break": leaves and closes; "resume": saves, leaves, resumes elsewhere
    epochs: int

    @classmethod
    def draw(cls, seed: int) -> Run:
        rng = random.Random(seed)
        samples = rng.randint(1, 1000)
        skip = rng.random() < 0.4
        schedule = Schedule.draw(seed, samples, faults=rng.random() < 0.4)
        options: dict = {"batch_size": rng.choice((1, 7, 64))}
        if rng.random() < 0.3:
            options["io_concurrency"] = rng.choice((1, 16, 256))
        if rng.random() < 0.2:
            options["in_order"] = False
        if skip:
            bad = len(schedule.fails | schedule.cancels)
            options.update(on_error="skip", max_skipped=bad + 1)
        batches = -(-samples // options["batch_size"])
        slow = rng.choice((0.0, 0.0, 0.001, 0.05))
        stall = (rng.randrange(batches), rng.uniform(0.5, 5.0)) if rng.random() < 0.2 else None
        stop_at = rng.randint(1, batches) if rng.random() < 0.3 else None
        return cls(
            seed, schedule, options, slow, stall, stop_at,
            stop=rng.choice(("break", "resume")), epochs=rng.choice((1, 1, 2)),
        )  # fmt: skip

    def bound(self) -> float:
        """Virtual seconds the run may take: every fetch one after another, the consumer's
        own time, and a second of slack per epoch."""
        batches = len(self.schedule.latency)  # at most one batch per sample
        consumer = self.consumer_s * 20 * batches + (self.stall[1] if self.stall else 0)
        return self.epochs * (2 * self.schedule.bound() + consumer + 1.0) + 1.0

    @property
    def bad(self) -> frozenset[int]:
        return self.schedule.fails | self.schedule.cancels

    def first_failing_batch(self) -> int | None:
        size = self.options["batch_size"]
        return min(self.bad) // size if self.bad and "on_error" not in self.options else None


async def consume(run: Run, loader: AsyncLoader, rng: random.Random, got: list[int]) -> dict | None:
    """One epoch as the run's consumer takes it; returns the state saved when it resumes."""
    taken = 0
    async for batch in loader:
        got.extend(int(x) for x in batch)
        taken += 1
        if run.stall is not None and taken == run.stall[0]:
            await asyncio.sleep(run.stall[1])
        elif run.consumer_s:
            await asyncio.sleep(rng.expovariate(1 / run.consumer_s))
        if taken == run.stop_at:
            state = loader.state_dict() if run.stop == "resume" else None
            break
    else:
        return None
    await loader.aclose()
    return state


async def epoch(run: Run, rng: random.Random, got: list[int]) -> None:
    """One epoch into ``got``, resumed in a second loader where the run stops to resume."""
    source = ScheduledSource(run.schedule)
    loader = AsyncLoader(source, **run.options)
    try:
        state = await consume(run, loader, rng, got)
    finally:
        await loader.aclose()
    if state is not None:
        again = AsyncLoader(source, **run.options)
        again.load_state_dict(state)
        try:
            async for batch in again:
                got.extend(int(x) for x in batch)
        finally:
            await again.aclose()


def check_epoch(run: Run, got: list[int], error: BaseException | None) -> None:
    samples = len(run.schedule.latency)
    size = run.options["batch_size"]
    failing = run.first_failing_batch()
    stopped = run.stop_at is not None and run.stop == "break"
    if failing is not None and not (stopped and run.stop_at <= failing):
        assert error is not None, "a failing sample did not fail its batch"
        assert any("stage=fetch" in note for note in getattr(error, "__notes__", ())), error
        want = list(range(failing * size))
    else:
        assert error is None, f"{error!r}"
        kept = [[i for i in range(at, min(at + size, samples)) if i not in run.bad]
                for at in range(0, samples, size)]  # fmt: skip
        delivered = [batch for batch in kept if batch]  # a batch with nothing kept is not
        if stopped:
            delivered = delivered[: run.stop_at]
        want = [i for batch in delivered for i in batch]
    if run.options.get("in_order", True):
        assert got == want, "not exactly once, in order"
    elif error is not None or stopped:  # out of order: which batches came first may vary
        assert len(set(got)) == len(got) and not run.bad.intersection(got), "not at most once"
    else:
        assert sorted(got) == sorted(want), "not exactly once"


def simulate(seed: int) -> None:
    """One run drawn from ``seed``, checked against every invariant."""
    run = Run.draw(seed)
    rng = random.Random(seed ^ 0xC0FFEE)
    with virtual_time(VirtualClockLoop()) as loop:

        async def main() -> None:
            async with deadline(run.bound()):
                for _ in range(run.epochs):
                    run.schedule.calls.clear()
                    got: list[int] = []
                    error = None
                    try:
                        await epoch(run, rng, got)
                    except Exception as exc:  # the source's own, or for its CancelledError
                        error = exc
                    check_epoch(run, got, error)
            me = asyncio.current_task()
            left = [t for t in asyncio.all_tasks() if t is not me]
            assert not left, f"left behind: {[t.get_name() for t in left]}"

        loop.run_until_complete(main())


@pytest.mark.parametrize("block", range(4))
def test_every_epoch_ends_exactly_once_in_order_with_nothing_left(block):
    """Randomised loader epochs on a virtual clock: liveness, exactly-once, order, cleanup."""
    run_block(simulate, block, 4, RUNS)
