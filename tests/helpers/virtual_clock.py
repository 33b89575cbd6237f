"""An asyncio event loop on a virtual clock, for simulating epochs by the thousand.

The loop's ``time()`` is a number the loop moves itself: whenever no callback is ready and no
file descriptor is readable, the clock jumps straight to the next timer (what trio's
``MockClock(autojump_threshold=0)`` does). A schedule of 20 ms sleeps then runs in
microseconds of real time, in an order that depends only on the schedule.

When every task waits and no timer is set, nothing can ever wake them on a loop that only
simulates: that is a hang, and :class:`Stuck` is raised out of ``run_until_complete`` with
every task's stack, instead of waiting for ever. Callbacks from other threads (a thread pool's
results) still arrive: before declaring a hang the loop waits ``idle_s`` of real time for one.
A run that never goes idle (a timer keeps firing) is bounded by :func:`deadline`, which
raises :class:`Stuck` with the same stacks, taken before anything is cancelled.

:func:`virtual_time` also points the library's measuring clock (``perf_counter`` read through
the module-level name ``now``) at the loop's, so the io tuner judges its rounds in virtual
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import selectors
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any


class Stuck(RuntimeError):
    """Every task waits, no timer is set and nothing arrived from another thread: a hang."""


class _JumpingSelector(selectors.BaseSelector):
    """A real selector that, instead of sleeping until a timer, moves the clock to it."""

    def __init__(self, clock: VirtualClockLoop, idle_s: float) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock
        self._idle_s = idle_s

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is not None:  # the next timer: jump to it
            self._clock.advance(timeout)
            return []
        ready = self._real.select(self._idle_s)  # a thread's callback may still come
        if ready:
            return ready
        raise Stuck(f"every task waits and no timer is set at t={self._clock.time():.3f}:\n"
                    + all_tasks_text(self._clock))  # fmt: skip


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock jumps to the next timer when nothing is ready."""

    def __init__(self, idle_s: float = 2.0) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self, idle_s))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds


def all_tasks_text(loop: asyncio.AbstractEventLoop) -> str:
    """Every task of ``loop`` with its stack, as text."""
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        out.write(f"--- {task.get_name()}\n")
        task.print_stack(limit=8, file=out)
    return out.getvalue()


@contextlib.asynccontextmanager
async def deadline(seconds: float) -> AsyncIterator[None]:
    """Bounds the block to ``seconds`` of (virtual) time, as ``asyncio.timeout`` does, except
    that on expiry every task's stack is taken first, while the hang is intact (the loader's
    shutdown would cancel what is stuck), and :class:`Stuck` carries it."""
    loop = asyncio.get_running_loop()
    stacks: list[str] = []
    timer: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(None) as scope:

            def expire() -> None:
                stacks.append(all_tasks_text(loop))
                scope.reschedule(loop.time())

            timer = loop.call_later(seconds, expire)
            yield
    except TimeoutError as exc:
        if not stacks:
            raise
        raise Stuck(
            f"still running at t={loop.time():.3f}, past its bound of {seconds:.3f} s; "
            f"every task when the bound passed:\n{stacks[0]}"
        ) from exc
    finally:
        if timer is not None:
            timer.cancel()


def _clock_users() -> list[tuple[Any, str]]:
    """The library's modules that read the time as ``now`` (``time.perf_counter``)."""
    return [
        (module, "now")
        for name, module in list(sys.modules.items())
        if name.startswith("asyncloader") and getattr(module, "now", None) is time.perf_counter
    ]


@contextlib.contextmanager
def virtual_time(loop: VirtualClockLoop) -> Iterator[VirtualClockLoop]:
    """Within the block, the library measures time on ``loop``'s clock; the loop is closed
    after it."""
    users = _clock_users()
    try:
        for module, name in users:
            setattr(module, name, loop.time)
        yield loop
    finally:
        for module, name in users:
            setattr(module, name, time.perf_counter)
        _cancel_all(loop)
        loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancels what a failed run left on ``loop`` and lets it unwind (nothing left pending)."""
    left = asyncio.all_tasks(loop)
    if not left:
        return
    for task in left:
        task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
