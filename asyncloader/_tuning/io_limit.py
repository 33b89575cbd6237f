"""``io_concurrency="auto"``: a hill climb of the fetch limit, on the fetch's own completions.

The fetch runs rounds of at least ``max(limit, MIN_ROUND)`` completed samples and
``ROUND_S`` seconds. A round is *saturated* when, at most of its completions, samples were
queued waiting for a free slot: the limit, not the consumer or the window, was holding the
fetch back. The round right after a change of the limit only settles: the samples it counts
were mostly started under the old limit, and a burst of new requests completing together
looks faster than the new limit runs (judged on it, a climb on a loop-bound fetch at 2 ms
per sample went on to 4096, where it ran at 0.7x the rate of 256). Rules at the end of a
judged round:

- Not saturated: nothing changes (more in flight would not be used).
- After a step up: if the round is not saturated, or its samples/s rose by less than
  ``GAIN`` (10%) over the round before the step, the step did not pay (the event loop's CPU,
  the source or the consumer is the limit now): back to the previous limit, and no change
  for ``HOLD_S``; the next probe is a step down.
- After a step down (halving): kept, and the next halving tried, while samples/s did not
  fall (fewer requests in flight cost the loop less per sample); else back, hold, and the
  next probe is a step up.
- Saturated otherwise (and not held): grow, up to the cap: by 4x until a step first fails to
  pay (a slow start), by 2x after that.

So a latency-bound source climbs 64, 256, 1024... two rounds (two latencies' worth of
samples) per step while that pays, a loop-bound one settles at the knee, where more in
flight costs the loop more than it gains, and when the latency later rises, the next probe
after a hold finds that growing pays again: the limit follows, within a few rounds. At the
cap nothing is probed (a fall in latency there is not followed down). The tuner lives
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

from asyncloader._base import nbytes

START = 64  # the first limit: the fixed default, so a short epoch is never slower than it
MIN_ROUND = 32
ROUND_S = 0.05  # a round lasts at least this: shorter ones measure the loop's hiccups
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
        "_down_next",
        "_held_until",
        "_probe",
        "_round_start",
        "_saturated",
        "_settling",
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
        #: The step being judged: (limit before it, samples/s then, True when it went up).
        self._probe: tuple[int, float, bool] | None = None
        self._settling = False  # the round now runs right after a change: not judged
        self._down_next = False  # the next probe halves (the last step up did not pay)
        self._held_until = 0.0
        self._size_known = False
        self._step = 4  # the slow start's; 2 after the first step that did not pay

    def restart(self, at: float) -> None:
        """A new epoch: the limit stays, the round starts afresh."""
        self._done = self._saturated = 0
        self._round_start, self._probe, self._settling = at, None, False

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
        if self._done < max(self.limit, MIN_ROUND) or at - self._round_start < ROUND_S:
            return None
        rate = self._done / max(at - self._round_start, 1e-9)
        saturated = self._saturated * 2 >= self._done
        self._done = self._saturated = 0
        self._round_start = at
        if self._settling:
            self._settling = False
            return None
        before = self.limit
        self._decide(rate, saturated, at)
        if self.limit == before:
            return None
        self._settling = True
        return self.limit

    def _decide(self, rate: float, saturated: bool, at: float) -> None:
        """The module's rules, at the end of a judged round."""
        probe, self._probe = self._probe, None
        if at < self._held_until:
            return
        if probe is not None:
            previous, then, up = probe
            paid = (saturated and rate >= then * GAIN) if up else rate >= then
            if not paid:
                self.limit, self._held_until = previous, at + HOLD_S
                self._down_next = up
                if up:
                    self._step = 2
                return
            if not up:
                self._step_down(rate)
                return
        if not saturated:
            return
        if self._down_next and probe is None:
            self._step_down(rate)
        elif self.limit < self._cap:
            self._probe = (self.limit, rate, True)
            self.limit = min(self._cap, self.limit * self._step)

    def _step_down(self, rate: float) -> None:
        """Halves the limit, to be judged; at ``MIN_ROUND`` the next probe goes up."""
        if self.limit // 2 < MIN_ROUND:
            self._down_next = False
            return
        self._probe = (self.limit, rate, False)
        self.limit //= 2
