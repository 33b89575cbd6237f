"""Fetcher as a state machine (hypothesis): every order of batches queued, fetches completing,
failing or raising CancelledError, limit moves, cancellations and close().

Each fetch is a future the machine resolves, and the limit moves as a tuner's would: on a
completion. After every step the loop runs until nothing is ready, and then: nothing live is
queued while fewer than the limit are being fetched (the liveness rule), every active runner
is fetching, no more are fetching than the highest limit set, and once closed and drained no
runner is left.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asyncloader._base.failure import Failure
from asyncloader._worker.fetch import Fetcher
from tests.helpers.depth import scaled

SETTLE_STEPS = 30  # loop iterations after a step: more than any chain of hand-offs takes


class ScriptedTuner:
    """Returns, at the next completion, the limit a rule chose (``FetchTuner``'s interface)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.next: int | None = None

    def completed(self, queued: bool, at: float, sample: object) -> int | None:
        new, self.next = self.next, None
        if new is not None:
            self.limit = new
        return new


class FetcherMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.pending: list[tuple[int, asyncio.Future[int]]] = []  # (index, its fetch)
        self.tuner = ScriptedTuner(2)
        self.top = 2
        self.group: asyncio.TaskGroup | None = None
        self.batches: dict[int, tuple[list[int], asyncio.Task]] = {}
        self.failing: set[int] = set()
        self.started: set[int] = set()
        self.next_index = 0
        self.closed = False
        self.owner = self.loop.create_task(self._own_group())
        self.settle()
        self.fetcher = Fetcher(self.get, 1 << 20, self.spawn, tuner=self.tuner)  # type: ignore[arg-type]

    async def _own_group(self) -> None:
        self.stop = asyncio.Event()
        async with asyncio.TaskGroup() as self.group:
            await self.stop.wait()

    def spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        assert self.group is not None
        return self.group.create_task(coro, name=name)

    def get(self, index: int) -> asyncio.Future[int]:
        future = self.loop.create_future()
        self.started.add(index)
        self.pending.append((index, future))
        return future

    def settle(self) -> None:
        async def steps() -> None:
            for _ in range(SETTLE_STEPS):
                await asyncio.sleep(0)

        self.loop.run_until_complete(steps())

    @precondition(lambda self: not self.closed)
    @rule(size=st.integers(1, 6))
    def queue_batch(self, size: int) -> None:
        indices = list(range(self.next_index, self.next_index + size))
        self.next_index += size
        seq = len(self.batches)
        task = self.loop.create_task(self.fetcher.fetch(seq, indices))
        self.batches[seq] = (indices, task)
        self.settle()

    @precondition(lambda self: self.pending)
    @rule(pick=st.integers(0, 1 << 16), outcome=st.sampled_from(["ok", "ok", "raise", "cancel"]))
    def complete(self, pick: int, outcome: str) -> None:
        index, future = self.pending.pop(pick % len(self.pending))
        if outcome == "ok":
            future.set_result(index)
        elif outcome == "raise":
            self.failing.add(index)
            future.set_exception(LookupError(index))
        else:
            self.failing.add(index)
            future.cancel()  # the source's own CancelledError, not the epoch's
        self.settle()

    @rule(limit=st.integers(1, 8))
    def move_limit(self, limit: int) -> None:
        self.tuner.next = limit
        self.top = max(self.top, limit)

    @precondition(lambda self: any(not t.done() for _, t in self.batches.values()))
    @rule(pick=st.integers(0, 1 << 16))
    def cancel_batch(self, pick: int) -> None:
        live = [t for _, t in self.batches.values() if not t.done()]
        live[pick % len(live)].cancel()
        self.settle()

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.closed = True
        self.fetcher.close()
        self.settle()

    @invariant()
    def no_live_sample_waits_while_there_is_room(self) -> None:
        fetcher = self.fetcher
        waiting = sum(
            1
            for indices, task in self.batches.values()
            if not task.done()
            for i in indices
            if i not in self.started
        )
        if waiting:
            assert fetcher.fetching >= fetcher.limit, (
                f"{waiting} samples wait with {fetcher.fetching} fetching under {fetcher.limit}"
            )
        assert fetcher.active == fetcher.fetching, "an active runner is not fetching"
        assert fetcher.fetching == len(self.pending)
        assert fetcher.fetching <= self.top

    @invariant()
    def results_are_right(self) -> None:
        for indices, task in self.batches.values():
            if task.done() and not task.cancelled():
                result = task.result()
                if self.failing.intersection(indices):
                    assert isinstance(result, Failure)
                else:
                    assert result == indices

    def teardown(self) -> None:
        try:
            if not self.closed:
                self.fetcher.close()
            while self.pending:
                index, future = self.pending.pop()
                future.set_result(index)
                self.settle()
            self.settle()
            runners = [
                t for t in asyncio.all_tasks(self.loop) if t.get_name().startswith("fetch-runner")
            ]
            assert not runners, f"{len(runners)} runners left after close"
            assert self.fetcher.active == self.fetcher.parked == 0
        finally:
            self.stop.set()
            self.settle()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.settle()
            self.loop.close()


FetcherMachine.TestCase.settings = settings(
    max_examples=scaled(300), stateful_step_count=40, deadline=None
)
TestFetcher = FetcherMachine.TestCase
