"""``io_concurrency="auto"``: a hill climb of the fetch limit, on the fetch's own completions.

The fetch runs rounds of ``max(limit, MIN_ROUND)`` completed samples. A round is *saturated*
when, at most of its completions, samples were queued waiting for a free slot: the limit,
not the consumer or the window, was holding the fetch back. Rules at the end of a round:

- Not saturated: nothing changes (more in flight would not be used).
- After a step up: if the round is not saturated, or its samples/s rose by less than
  ``GAIN`` (10%) over the round before the step, the step did not pay (the event loop's CPU,
  the source or the consumer is the limit now): back to the previous limit, and no growth
  for ``HOLD_S``.
- Saturated otherwise (and not held): grow, up to the cap: by 4x until a step first fails to
  pay (a slow start), by 2x after that.

So a latency-bound source climbs 64, 256, 1024... about one round (one latency's worth of
samples) per step while that pays, and when the latency later rises, the next probe after a
hold finds that growing pays again: the limit follows, within a few rounds. The tuner lives
as long as the loader (in a worker, as the worker): a later epoch starts where the last one
left the limit. The loader's window is sized for twice the limit, so that a fetch held back
by its limit has samples queued (and looks saturated). The cap is
``min(cap, memory_budget // sample bytes)``, the sample's size measured from the first
samples fetched: samples in flight never hold more than the budget. It is also at most half
the file descriptors the process may still open (``RLIMIT_NOFILE``'s soft limit less those
open when the tuner starts): a request in flight may hold a socket or an open file, and the
usual soft limit of 1,024 would otherwise fail the epoch with "Too many open files".
"""

from __future__ import annotations

import os

from asyncloader._base.structure import nbytes

START = 64  # the first limit: the fixed default, so a short epoch is never slower than it
MIN_ROUND = 32
GAIN = 1.10
HOLD_S = 1.0


def file_room() -> int | None:
    """Half the file descriptors this process may still open (None: no limit known)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    for fds in ("/proc/self/fd", "/dev/fd"):
        try:
            open_now = len(os.listdir(fds))
            break
        except OSError:
            continue
    else:
        open_now = 0
    return max(1, (soft - open_now) // 2)


class FetchTuner:
    """The limit of one fetcher under ``io_concurrency="auto"`` (see the module rules).

    Args:
        cap: The highest limit.
        budget: Bytes the samples in flight may hold at most.
        start: The clock (``perf_counter``) now.
    """

    __slots__ = (
        "_budget",
        "_cap",
        "_done",
        "_grown_from",
        "_held_until",
        "_round_start",
        "_saturated",
        "_size_known",
        "_step",
        "limit",
    )

    def __init__(self, cap: int, budget: int, start: float) -> None:
        room = file_room()
        self._cap, self._budget = cap if room is None else min(cap, room), budget
        self.limit = min(START, self._cap)
        self._done = self._saturated = 0
        self._round_start = start
        self._grown_from: tuple[int, float] | None = None  # (limit, samples/s) before the step
        self._held_until = 0.0
        self._size_known = False
        self._step = 4  # the slow start's; 2 after the first step that did not pay

    def restart(self, at: float) -> None:
        """A new epoch: the limit stays, the round starts afresh."""
        self._done = self._saturated = 0
        self._round_start, self._grown_from = at, None

    def completed(self, queued: bool, at: float, sample: object) -> int | None:
        """One sample arrived at ``at`` (``queued``: others waited for a slot); returns the
        new limit when it changes."""
        if not self._size_known:
            self._size_known = True
            self._cap = max(1, min(self._cap, self._budget // max(1, nbytes(sample))))
            if self.limit > self._cap:
                self.limit = self._cap
                return self.limit
        self._done += 1
        self._saturated += queued
        if self._done < max(self.limit, MIN_ROUND):
            return None
        rate = self._done / max(at - self._round_start, 1e-9)
        saturated = self._saturated * 2 >= self._done
        self._done = self._saturated = 0
        self._round_start = at
        before = self.limit
        if at < self._held_until:
            self._grown_from = None
        elif self._grown_from is not None and (not saturated or rate < self._grown_from[1] * GAIN):
            self.limit, self._grown_from = self._grown_from[0], None
            self._held_until, self._step = at + HOLD_S, 2
        elif saturated and self.limit < self._cap:
            self._grown_from = (self.limit, rate)
            self.limit = min(self._cap, self.limit * self._step)
        else:
            self._grown_from = None
        return self.limit if self.limit != before else None
