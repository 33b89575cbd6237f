"""Admission with a size that may move: the epoch's window, and the engine's room.

The epoch admits a batch into its window before taking it from the sampler and gives the slot
back when the consumer receives it; the transformer admits a batch into the engine's room
before submitting it. The "auto" settings resize both while batches are in flight
(``io_concurrency`` and ``prefetch``): a smaller size is reached as batches leave, never by
taking a slot back, so the bound that holds at every moment is the largest size ever set.
"""

from __future__ import annotations

import asyncio
import threading


class Window:
    """Admission of batches, on the loop's thread only.

    ``permits.value + ahead == size + debt`` at every await point. :meth:`resize` moves
    ``size``; a smaller size is reached as batches leave (``debt`` of them are not given
    back), so ``ahead`` never exceeds the largest size the window ever had.
    :meth:`reached` lets another thread wait for the high-water mark ``max_ahead``.
    ``admitted`` counts admissions, ``blocked`` those that found no slot free and waited.

    Liveness: while an :meth:`admit` waits and ``ahead < size``, a permit is free
    (``permits.value = size - ahead + debt >= 1``), and whoever made it free woke the waiter:
    :meth:`release` (or a :meth:`resize` that grows past the debt) releases the semaphore,
    and a release wakes the first waiter. A shrink only adds debt, paid by releases, so the
    waiter is woken by the release that brings ``ahead`` below the new size. Each admitted
    holder releases exactly once (``async with``, or the epoch's hand-over to the consumer);
    a waiter cancelled after it was woken passes the permit on (asyncio's Semaphore does:
    checked against CPython 3.11.7's ``acquire``).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._permits = asyncio.Semaphore(size)
        self._debt = 0
        self.ahead = 0
        self.max_ahead = 0
        self.admitted = self.blocked = 0
        self._marks: list[tuple[int, threading.Event]] = []  # (level, set once reached)
        self._marks_lock = threading.Lock()

    def resize(self, size: int) -> None:
        grow, self.size = size - self.size, size
        if grow < 0:
            self._debt -= grow
            return
        paid = min(grow, self._debt)
        self._debt -= paid
        for _ in range(grow - paid):
            self._permits.release()

    async def admit(self) -> None:
        self.admitted += 1
        if self._permits.locked():
            self.blocked += 1
        await self._permits.acquire()
        self.ahead += 1
        if self.ahead > self.max_ahead:  # at most ``size`` times an epoch
            self.max_ahead = self.ahead
            if self._marks:
                with self._marks_lock:
                    for level, event in self._marks:
                        if level <= self.max_ahead:
                            event.set()

    def reached(self, level: int) -> threading.Event:
        """An event set once ``max_ahead >= level`` (already set if it is), for any thread."""
        event = threading.Event()
        with self._marks_lock:
            # listed before max_ahead is read: admit() raises it, then reads the list
            self._marks.append((level, event))
            if self.max_ahead >= level:
                event.set()
        return event

    async def __aenter__(self) -> None:
        await self.admit()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        self.ahead -= 1
        if self._debt:
            self._debt -= 1
        else:
            self._permits.release()
