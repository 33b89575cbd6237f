"""The reassembly buffer: batches complete in any order and leave in sequence order.

::

    completed:   seq 2   seq 0   seq 3   seq 1
    released:            0               1 2 3      (in_order=True)
    released:    2       0       3       1          (in_order=False)

Every batch in the buffer holds one of the epoch's window permits (taken when its indices left
the sampler, returned when the consumer receives it), so the buffer never holds more than the
window, however late one batch is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class ReorderBuffer:
    """Single-consumer buffer keyed by sequence number.

    Liveness: while :meth:`get` waits, ``_changed`` was cleared after the buffer was last
    checked, with no await between, on the loop's one thread; each change that can let it
    return sets it: :meth:`put` of the seq it waits for (in order) or of any seq (not),
    :meth:`finish`, :meth:`fail`. A put of a later seq sets nothing; its turn comes when
    the seq before it is put. So the consumer waits only for a batch not yet put, and every
    admitted batch is put (its task ends in :meth:`put`) or fails the epoch (:meth:`fail`,
    from the epoch's ``_run`` on every exit path, cancellation included).

    Args:
        in_order: Release seq 0, 1, 2, ... (``True``) or in completion order (``False``).
        start: The first seq (a resumed epoch starts where the saved one stopped).
        skip: Seqs that will never come (delivered before a checkpoint): the order steps over
            them.
    """

    def __init__(self, in_order: bool, start: int = 0, skip: frozenset[int] = frozenset()) -> None:
        self._in_order = in_order
        self._pending: dict[int, Any] = {}
        self._ready: deque[tuple[int, Any]] = deque()
        self._skip = skip
        self._next = self._step(start)  # with in_order, the next seq to release
        self._released = 0
        self._total: int | None = None
        self._error: BaseException | None = None
        self._changed = asyncio.Event()

    def _step(self, seq: int) -> int:
        while seq in self._skip:
            seq += 1
        return seq

    @property
    def next_seq(self) -> int | None:
        """The seq the consumer waits for (in order), or None when any will do or all are out."""
        if not self._in_order or self._released == self._total:
            return None
        return self._next

    def __len__(self) -> int:
        return len(self._pending) + len(self._ready)

    @property
    def ready(self) -> int:
        """Of :func:`len`, the batches the consumer may take now, one after another (the rest
        wait for an earlier one). Counted on each call: for diagnostics, not per batch."""
        if not self._in_order:
            return len(self._ready)
        seq, ready = self._next, 0
        while seq in self._pending:
            seq, ready = self._step(seq + 1), ready + 1
        return ready

    def put(self, seq: int, item: Any) -> None:
        """Adds the result (batch or Failure) of ``seq``."""
        if self._in_order:
            self._pending[seq] = item
            if seq != self._next:
                return
        else:
            self._ready.append((seq, item))
        self._changed.set()

    def finish(self, total: int) -> None:
        """Declares that ``total`` items are all there will be."""
        self._total = total
        self._changed.set()

    def fail(self, exc: BaseException) -> None:
        """Makes the consumer's next ``get`` raise ``exc`` (after nothing else)."""
        if self._error is None:
            self._error = exc
        self._changed.set()

    def _pop(self) -> tuple[int, Any] | None:
        if self._in_order:
            seq = self._next
            if seq in self._pending:
                self._next = self._step(seq + 1)
                return seq, self._pending.pop(seq)
            return None
        return self._ready.popleft() if self._ready else None

    async def get(self) -> tuple[int, Any]:
        """Returns the next ``(seq, item)`` to release.

        Raises:
            StopAsyncIteration: All ``total`` items were released.
            BaseException: Whatever was passed to :meth:`fail`.
        """
        while True:
            if self._error is not None:
                raise self._error
            popped = self._pop()
            if popped is not None:
                self._released += 1
                return popped
            if self._released == self._total:
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()
