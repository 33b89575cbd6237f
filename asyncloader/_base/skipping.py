"""``on_error="skip"``: samples that raise are left out of their batch, counted and logged.

Where a sample fails (a worker, a loader thread, the event loop), its batch carries on without
it: the stage wraps what it made in a :class:`Trimmed` with one :class:`Skip` per sample left
out. The wrapper never reaches the user. The consumer's iterator hands it to
:meth:`SkipLedger.settle`, in delivery order and in the consumer's process, which counts and
logs each skip and gives back the batch to yield, the batch's :class:`Failure` once the budget
is spent, or :data:`EMPTY` when no sample of the batch was left (that batch is not yielded).

::

    worker / thread / loop              consumer's process, in delivery order
    ──────────────────────              ─────────────────────────────────────
    Trimmed(batch, [Skip, ...]) ──────► settle: count, log ─► batch | Failure | EMPTY
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from asyncloader._base import recorder as tracing
from asyncloader._base.failure import Failure
from asyncloader._base.redaction import RedactingFilter, redact_text

log = logging.getLogger("asyncloader")
log.addFilter(RedactingFilter())  # each record through the sources' redactors

#: How many ``(index, reason)`` a loader keeps in ``skip_log``.
SKIP_LOG_LENGTH = 16

#: What :meth:`SkipLedger.settle` gives back for a batch whose samples were all skipped.
EMPTY: Any = object()


class Skip:
    """One sample left out of batch ``seq``: where it failed and the error (as a Failure)."""

    __slots__ = ("failure", "index", "stage")

    def __init__(self, index: Any, stage: str, failure: Failure) -> None:
        self.index = index
        self.stage = stage
        self.failure = failure

    @classmethod
    def capture(
        cls, exc: BaseException, stage: str, seq: int, indices: Sequence[Any], index: Any
    ) -> Skip:
        """Annotates ``exc`` as a failing batch's error would be, and records it."""
        return cls(index, stage, Failure.capture(exc, stage, seq, indices, index))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Skip, (self.index, self.stage, self.failure))


class Trimmed:
    """A batch some samples were left out of (internal: never handed to the user).

    Attributes:
        batch: The batch of the samples kept, its Failure (collate raised), or the kept samples
            themselves between fetch and transform; ``None`` when none was kept.
        skips: The samples left out, in the order they failed.
        empty: No sample of the batch was kept.
        indices: Between fetch and transform: the indices of the samples kept.
    """

    __slots__ = ("batch", "empty", "indices", "skips")

    def __init__(
        self, batch: Any, skips: list[Skip], empty: bool = False, indices: Sequence[Any] = ()
    ) -> None:
        self.batch = batch
        self.skips = skips
        self.empty = empty
        self.indices = indices

    def __reduce__(self) -> tuple[Any, ...]:
        return (Trimmed, (self.batch, self.skips, self.empty, list(self.indices)))


class SkipLedger:
    """The skip count of one epoch against ``max_skipped``; thread-safe.

    Args:
        max_skipped: The most samples this epoch may skip; the next one fails its batch.
        recent: Where the last few ``(index, reason)`` go (the loader's ``skip_log``, kept
            across epochs).
    """

    def __init__(self, max_skipped: int, recent: deque[tuple[Any, str]]) -> None:
        self.max_skipped = max_skipped
        self.count = 0
        self.recent = recent
        self._lock = threading.Lock()

    def settle(self, seq: int, trimmed: Trimmed) -> Any:
        """Counts and logs the skips of batch ``seq``; returns what the consumer gets.

        Returns:
            The batch of the samples kept; a :class:`Failure` (collate raised, or a skip past
            the budget: the user's exception with a note that ``max_skipped`` is spent); or
            :data:`EMPTY` when every sample of the batch was skipped.
        """
        for skip in trimmed.skips:
            exc = skip.failure.exc
            with self._lock:
                spent = self.count >= self.max_skipped
                if not spent:
                    self.count += 1
                    count = self.count
                    reason = redact_text(f"{type(exc).__qualname__}: {exc}")
                    self.recent.append((skip.index, reason))
            if spent:
                exc.add_note(
                    f"asyncloader: on_error='skip' gave up: {self.count} samples skipped in "
                    f"this epoch already, the budget max_skipped={self.max_skipped} is spent"
                )
                return skip.failure
            skipped = {"index": repr(skip.index), "batch": seq, "stage": skip.stage}
            tracing.instant("skip", "failure", skipped)
            log.warning(
                "skipped sample index=%r of batch %d at stage=%s (%d of max_skipped=%d): %s",
                skip.index,
                seq,
                skip.stage,
                count,
                self.max_skipped,
                reason,
            )
        return EMPTY if trimmed.empty else trimmed.batch
