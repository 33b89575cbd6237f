"""Waiting in tests on what the code under test signals, never on a clock: a :class:`Count`
that its producer notifies, and threading events (such as an epoch's ``ahead_reached``).

Every wait has a deadline (``WAIT_S``) and fails the test naming what it waited for. A
consumer on an event loop waits in a helper thread, so that the loop, which may be the one
doing the work awaited, keeps running.
"""

from __future__ import annotations

import asyncio
import threading

WAIT_S = 30.0


def wait_event(event: threading.Event, what: str, timeout_s: float = WAIT_S) -> None:
    """Blocks until ``event`` is set, else AssertionError naming ``what``."""
    assert event.wait(timeout_s), f"waited {timeout_s} s for {what}"


async def await_event(event: threading.Event, what: str, timeout_s: float = WAIT_S) -> None:
    """:func:`wait_event` for a consumer on an event loop, which keeps running meanwhile."""
    await asyncio.to_thread(wait_event, event, what, timeout_s)


class Count:
    """A count that any thread adds to and any thread waits on (a ``threading.Condition``).

    A copy pickled into another process starts again from 0: counts are per process.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.value = 0

    def __reduce__(self) -> tuple:
        return (Count, ())

    def add(self, n: int = 1) -> None:
        with self._changed:
            self.value += n
            self._changed.notify_all()

    def reset(self) -> None:
        with self._changed:
            self.value = 0

    def wait_for(self, at_least: int, what: str, timeout_s: float = WAIT_S) -> None:
        """Blocks until the count is ``at_least``, else AssertionError naming ``what``."""
        with self._changed:
            reached = self._changed.wait_for(lambda: self.value >= at_least, timeout_s)
        assert reached, f"waited {timeout_s} s for {what} (count {self.value} < {at_least})"

    async def await_for(self, at_least: int, what: str, timeout_s: float = WAIT_S) -> None:
        """:meth:`wait_for` for a consumer on an event loop, which keeps running meanwhile."""
        await asyncio.to_thread(self.wait_for, at_least, what, timeout_s)
