"""``on_error="skip"``: bad samples are counted, logged and marked, never dropped silently.

A map-style source cannot leave a hole at index ``i``, so in place of a bad sample it returns
a :class:`Skipped` marker; :func:`drop_skipped` wraps a collate function to leave markers out
of the batch, and :func:`pass_skipped` wraps a transform to pass them through untouched. An
iterable source simply does not yield the sample. Either way the source's ``skipped`` count
grows, ``skip_log`` keeps the last few reasons, and a warning is logged. Once ``max_skipped``
would be exceeded, the error is raised as in the default ``on_error="raise"``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import default_collate

from asyncloader._base import check_on_error, redact_text, tracing

log = logging.getLogger("asyncloader.sources")
_LOG_LENGTH = 16


@dataclass(frozen=True, slots=True)
class Skipped:
    """Stands in for a sample that ``on_error="skip"`` skipped.

    Attributes:
        index: The index asked for.
        target: The redacted URL, key or path.
        reason: The error, as text.
    """

    index: Any
    target: str
    reason: str


class Skips:
    """The skip policy and count of one source; safe to share between loops and threads.

    Args:
        on_error: ``"raise"`` (default) or ``"skip"``.
        max_skipped: With ``"skip"``, the most samples to skip (in this source's lifetime)
            before raising; required there.
    """

    def __init__(self, on_error: str, max_skipped: int | None) -> None:
        check_on_error(on_error, max_skipped, budget="in the source's lifetime")
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.count = 0
        self.recent: deque[str] = deque(maxlen=_LOG_LENGTH)
        self._lock = threading.Lock()

    def absorb(self, exc: BaseException, target: str, reason: str, samples: int = 1) -> bool:
        """Counts ``samples`` skipped because of ``exc``; False when ``exc`` must be raised.

        With ``"skip"`` and the budget spent, a note saying so is added to ``exc``.
        """
        if self.on_error == "raise":
            return False
        target, reason = redact_text(target), redact_text(reason)  # the sources' redactors
        with self._lock:
            assert self.max_skipped is not None
            if self.count + samples > self.max_skipped:
                exc.add_note(
                    f"asyncloader: on_error='skip' gave up: {self.count} skipped already, "
                    f"max_skipped={self.max_skipped}"
                )
                return False
            self.count += samples
            self.recent.append(f"{target}: {reason}")
            count = self.count
        log.warning("skipped %d sample(s) of %s (%d so far): %s", samples, target, count, reason)
        tracing.instant("skip", "source", {"target": target, "samples": samples, "reason": reason})
        return True

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()


def _drop(collate_fn: Callable[[list[Any]], Any], samples: list[Any]) -> Any:
    kept = [s for s in samples if not isinstance(s, Skipped)]
    return collate_fn(kept) if kept else None


def _pass(transform: Callable[[Any], Any], sample: Any) -> Any:
    return sample if isinstance(sample, Skipped) else transform(sample)


def drop_skipped(
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Callable[[list[Any]], Any]:
    """A collate function that leaves :class:`Skipped` markers out (picklable).

    Args:
        collate_fn: Collates the samples kept; default ``default_collate``.

    Returns:
        ``fn(samples)``: the collated batch, or ``None`` when every sample was skipped.
    """
    return functools.partial(_drop, collate_fn or default_collate)


def pass_skipped(transform: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A transform that returns :class:`Skipped` markers untouched (picklable)."""
    return functools.partial(_pass, transform)
