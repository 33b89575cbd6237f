"""The progress record of one epoch: what the consumer has received, read by ``state_dict()``.

Shared between threads behind one lock:

- the consumer's thread calls :meth:`Progress.delivered` for every batch it receives (from
  ``__next__`` of the sync iterator, or on the loop for ``async for``);
- the thread that pulls an iterable source calls :meth:`Progress.source_state_before` with the
  source's own state before each batch (the ``asyncloader-source`` thread, or the loop);
- any thread may call :meth:`Progress.checkpoint` (``AsyncLoader.state_dict()``) and read
  :attr:`Progress.batches`.

Every method takes the lock for its whole body, so a checkpoint never sees a cursor that moved
without its source state, or the reverse.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any

from asyncloader._checkpoint.record import Resume


@dataclass
class Cursor:
    """The batches of one epoch the consumer has received: all below ``next``, and ``beyond``.

    ``beyond`` is non-empty only with ``in_order=False``, and never larger than the window.
    """

    next: int = 0
    beyond: set[int] = field(default_factory=set)

    def add(self, seq: int) -> None:
        if seq != self.next:
            self.beyond.add(seq)
            return
        self.next += 1
        while self.next in self.beyond:
            self.beyond.remove(self.next)
            self.next += 1


class Progress:
    """What the consumer has received of one epoch (see the module docstring for the threads).

    Args:
        resume: Where the epoch starts (batches below ``resume.start`` and in ``resume.skip``
            count as received).
        source_state: ``(seq, state)``: an iterable source's own state before the first
            batch it will give, when it keeps one; ``None`` for every other source.
        opening: Workers open the source's iterations (``fetch_in_workers``): the state
            before the first batch is final only once :meth:`source_opened` was called.
    """

    def __init__(
        self, resume: Resume, source_state: tuple[int, Any] | None = None, opening: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self._cursor = Cursor(resume.start, set(resume.skip))
        # seq -> the source's state before batch seq, pruned below the cursor as batches arrive.
        self._states: dict[int, Any] | None = (
            dict([source_state]) if source_state is not None else None
        )
        self._batches = 0
        self._finished = False
        # Set once the workers opened their iterations (fetch_in_workers; see _streams), or
        # the epoch ended without: until then the state before the first batch is not known.
        self._opened = threading.Event()
        if not opening:
            self._opened.set()

    @property
    def tracks_source(self) -> bool:
        """The source keeps state: :meth:`source_state_before` must be told each batch's."""
        return self._states is not None

    @property
    def batches(self) -> int:
        """Batches the consumer received in this epoch (not counting a resumed epoch's past)."""
        with self._lock:
            return self._batches

    @property
    def next_batch(self) -> int:
        """The first batch (seq) the consumer has not received; all before it it has."""
        with self._lock:
            return self._cursor.next

    @property
    def finished(self) -> bool:
        """The consumer saw the end of the epoch."""
        with self._lock:
            return self._finished

    def finish(self) -> None:
        with self._lock:
            self._finished = True

    def source_opened(self) -> None:
        """The source's state before the first batch is recorded (or never will be)."""
        self._opened.set()

    def wait_source_opened(self, timeout: float) -> bool:
        """Waits at most ``timeout`` seconds for :meth:`source_opened`; True once it was."""
        return self._opened.wait(timeout)

    def source_state_before(self, seq: int, state: Any) -> None:
        """Records the source's own state before batch ``seq`` (after batch ``seq - 1``)."""
        with self._lock:
            if self._states is not None and seq >= self._cursor.next:
                self._states[seq] = state

    def delivered(self, seq: int) -> None:
        """Records that the consumer received batch ``seq``."""
        with self._lock:
            self._batches += 1
            self._cursor.add(seq)
            if self._states is not None:
                for old in [k for k in self._states if k < self._cursor.next]:
                    del self._states[old]

    def checkpoint(self) -> dict[str, Any]:
        """What the consumer has received of this epoch, JSON-friendly (see
        ``_checkpoint.record``)."""
        with self._lock:
            cursor = self._cursor
            source_state = None if self._states is None else self._states.get(cursor.next)
            return {
                "next_batch": cursor.next,
                "delivered_beyond": sorted(cursor.beyond),
                # A copy: the records behind it are shared with later ones until replaced.
                "source_state": copy.deepcopy(source_state),
            }
