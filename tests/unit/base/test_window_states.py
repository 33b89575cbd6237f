"""The window and the reorder buffer as state machines (hypothesis): every order of
admissions, releases and resizes; of batches completing, the end declared and a failure.

After every step the loop runs until nothing is ready. The window then never has an admission
waiting while it has room (``ahead < size``), never holds more than the largest size it had,
and keeps ``permits + ahead == size + debt``. The reorder buffer hands its consumer every seq
that can leave (in order: the longest run from the next one), ends the consumer once all are
out, and raises a failure at the consumer's next ``get``.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asyncloader._base.reorder import ReorderBuffer
from asyncloader._base.window import Window
from tests.helpers.depth import scaled

SETTLE_STEPS = 20


def settle(loop: asyncio.AbstractEventLoop) -> None:
    async def steps() -> None:
        for _ in range(SETTLE_STEPS):
            await asyncio.sleep(0)

    loop.run_until_complete(steps())


class WindowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.window = Window(3)
        self.largest = 3
        self.waiting: list[asyncio.Task] = []
        self.admitted = 0  # admissions that returned and were not released yet

    async def _admit(self) -> None:
        await self.window.admit()
        self.admitted += 1

    @rule()
    def admit(self) -> None:
        self.waiting.append(self.loop.create_task(self._admit()))
        settle(self.loop)

    @precondition(lambda self: self.admitted > 0)
    @rule()
    def release(self) -> None:
        self.admitted -= 1
        self.window.release()
        settle(self.loop)

    @rule(size=st.integers(1, 6))
    def resize(self, size: int) -> None:
        self.largest = max(self.largest, size)
        self.window.resize(size)
        settle(self.loop)

    @precondition(lambda self: any(not t.done() for t in self.waiting))
    @rule()
    def cancel_a_waiting_admission(self) -> None:
        next(t for t in self.waiting if not t.done()).cancel()
        settle(self.loop)

    @invariant()
    def an_admission_waits_only_when_the_window_is_full(self) -> None:
        window = self.window
        blocked = sum(1 for t in self.waiting if not t.done())
        if blocked:
            assert window.ahead >= window.size, f"{blocked} wait, {window.ahead} < {window.size}"
        assert window.ahead == self.admitted <= self.largest
        permits = window._permits._value
        assert permits + window.ahead == window.size + window._debt

    def teardown(self) -> None:
        for task in self.waiting:
            task.cancel()
        settle(self.loop)
        self.loop.close()


class ReorderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.buffer = ReorderBuffer(in_order=True)
        self.put_seqs: set[int] = set()
        self.released: list[int] = []
        self.outcome: str | None = None  # "end" or "failed", once the consumer stops
        self.total: int | None = None
        self.consumer = self.loop.create_task(self._consume())

    async def _consume(self) -> None:
        try:
            while True:
                seq, item = await self.buffer.get()
                assert item == -seq
                self.released.append(seq)
        except StopAsyncIteration:
            self.outcome = "end"
        except LookupError:
            self.outcome = "failed"

    @rule(seq=st.integers(0, 12))
    def put(self, seq: int) -> None:
        if seq in self.put_seqs or (self.total is not None and seq >= self.total):
            return
        self.put_seqs.add(seq)
        self.buffer.put(seq, -seq)
        settle(self.loop)

    @precondition(lambda self: self.total is None)
    @rule(extra=st.integers(0, 3))
    def finish(self, extra: int) -> None:
        self.total = max(self.put_seqs, default=-1) + 1 + extra
        self.buffer.finish(self.total)
        settle(self.loop)

    @precondition(lambda self: self.outcome is None)
    @rule()
    def fail(self) -> None:
        self.buffer.fail(LookupError("a batch failed"))
        settle(self.loop)
        assert self.outcome == "failed", "a failure did not reach the waiting consumer"

    @invariant()
    def every_seq_that_can_leave_has_left(self) -> None:
        if self.outcome == "failed":
            return
        run = 0
        while run in self.put_seqs:
            run += 1
        assert self.released == list(range(run)), f"{self.released} with {self.put_seqs} in"
        if self.total is not None and run == self.total:
            assert self.outcome == "end", "every seq is out but the consumer still waits"
        else:
            assert self.outcome is None

    def teardown(self) -> None:
        self.consumer.cancel()
        settle(self.loop)
        self.loop.close()


quick = settings(max_examples=scaled(150), stateful_step_count=30, deadline=None)
WindowMachine.TestCase.settings = quick
ReorderMachine.TestCase.settings = quick
TestWindow = WindowMachine.TestCase
TestReorder = ReorderMachine.TestCase
