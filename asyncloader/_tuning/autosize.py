"""``num_workers="auto"`` and ``prefetch="auto"``: the pool and the window sized by measurement.

Little's law sets what the loader must hold: batches in flight = throughput x the time each
spends in flight. Neither factor is known before the data is seen, so both knobs start where
a fixed setting would and move on what the epoch measures, each by a hill climb that keeps a
step only when it paid.

Workers change **between epochs** (:class:`WorkerTuner`), on the epoch's bottleneck
(:mod:`asyncloader._tuning.report`):

- The first epoch gets the usable cores (CPU affinity, divided among the ranks of this node
  under torchrun's ``LOCAL_WORLD_SIZE``), or 0 where the workers would only collate samples
  fetched on this process's event loop (an async or iterable source without ``transform`` or
  ``collate_fn``): a pool there costs a pickle round trip per batch and buys nothing.
- ``cpu`` (the engine held its window and the consumer waited): one more, up to the cores.
  Kept when the next epoch's samples/s rose by ``GAIN``; else undone, and that count is not
  tried again.
- ``consumer`` (the consumer waited under 10% of its time) with a worker or more idle on
  average: one fewer, never below 1 (or 0 where it started at 0). Kept while the loader
  still keeps up; else undone, and the loader never goes below that count again.
- Never more than ``memory_budget`` holds: ``workers x prefetch`` batches of the measured
  size. An epoch of fewer than ``MIN_EPOCH_BATCHES`` batches moves nothing.

Within an epoch the workers stay: a worker's id, seed and share of an iterable source are
fixed for its life (DataLoader's ``get_worker_info()``), a process pool cannot change size,
and starting one costs 0.1 s (fork) to 1 s (forkserver), which the epoch that measured the
need would pay. A whole epoch is also the least noisy measurement there is.

``prefetch`` changes **within an epoch** (:class:`PrefetchTuner`), in rounds of
``max(window, MIN_ROUND)`` batches received by the consumer: when the consumer waited for
``STALLED`` (10%) of its time or more and most admissions found the window full, ``prefetch``
doubles (up to ``PREFETCH_CAP`` and to what ``memory_budget`` holds, but never below
``PREFETCH_START``: the budget bounds growth, so "auto" never holds less than the fixed
default would). After a step, a round whose batches/s did not rise by ``GAIN`` undoes it and
holds for ``HOLD_S``. The window
follows every move (:class:`asyncloader._base.window.Window`): it never holds more batches than its
largest size, which is at most ``Options.window`` (sized for ``PREFETCH_CAP``).
"""

from __future__ import annotations

from asyncloader._base import available_cores
from asyncloader._config import PREFETCH_CAP, PREFETCH_START
from asyncloader._tuning.io_limit import GAIN
from asyncloader._tuning.stats import LoaderStats

MIN_ROUND = 8  # batches in a prefetch round at least
HOLD_S = 1.0
STALLED = 0.10  # the consumer waited this share of its time: the loader set the pace
WINDOW_FULL = 0.5  # this share of admissions waited for a slot: the window set it
MIN_EPOCH_BATCHES = 16


def steady_rate(stats: LoaderStats) -> float:
    """Samples/s after the first batch (start-up left out)."""
    span = stats.elapsed - (stats.first_batch or 0.0)
    return stats.samples / span if span > 0 else 0.0


class WorkerTuner:
    """The worker count of one loader under ``num_workers="auto"`` (see the module rules).

    It moves only between epochs, on a finished epoch's stats; a persistent pool of another
    count is replaced when the next epoch leases it (``Workers.lease``), and a batch of an
    older epoch still running there that the replaced pool cancels fails that epoch rather
    than hanging it (``transform._answer``).

    Args:
        start: The first epoch's count (:func:`asyncloader._config.defaults.start_workers`).
        budget: Bytes the batches in the window may hold.
    """

    def __init__(self, start: int, budget: int) -> None:
        self.count = start
        self._budget = budget
        self._floor = min(start, 1)
        self._ceiling = max(start, available_cores() or 1)
        self._tried: tuple[int, float] | None = None  # (count before the step, its samples/s)

    def epoch_ended(self, stats: LoaderStats, stage: str, prefetch: int, batch_bytes: int) -> int:
        """Moves the count on the epoch just ended (``stage``: its bottleneck, ``prefetch``
        and ``batch_bytes``: where its window ended and its batches' size); returns it."""
        if stats.batches < MIN_EPOCH_BATCHES:
            return self.count
        rate, tried, self._tried = steady_rate(stats), self._tried, None
        if batch_bytes:
            fits = self._budget // (batch_bytes * max(1, prefetch))
            self._ceiling = max(self._floor, min(self._ceiling, fits))
        if tried is not None:
            before, before_rate = tried
            if self.count > before and rate < before_rate * GAIN:  # growing did not pay
                self._ceiling, self.count = before, before
            elif self.count < before and stage != "consumer":  # the loader fell behind
                self._floor, self.count = before, before
            return self.count
        if stage == "cpu" and self.count < self._ceiling:
            self._tried = (self.count, rate)
            self.count += 1
        elif (
            stage == "consumer"
            and self.count > self._floor
            and stats.engine_in_flight <= self.count - 1
        ):
            self._tried = (self.count, rate)
            self.count -= 1
        self.count = min(self.count, self._ceiling)
        return self.count


class PrefetchTuner:
    """``prefetch`` of one loader under ``prefetch="auto"`` (see the module rules); kept
    across its epochs.

    Liveness: a move only resizes the window and the engine's room
    (:class:`~asyncloader._base.window.Window`): deepening frees permits at once, shallowing
    only adds debt that the batches in flight pay as the consumer receives them, and every
    size is at least 1, so no admission waits on a slot that no batch in flight will free.

    Args:
        budget: Bytes the batches in the window may hold.
    """

    def __init__(self, budget: int) -> None:
        self.prefetch = PREFETCH_START
        self._budget = budget
        self._cap = PREFETCH_CAP
        self._workers = 1
        self._grown_from: tuple[int, float] | None = None  # (prefetch, batches/s) before
        self._held_until = 0.0
        self.restart(1)

    def restart(self, workers: int) -> None:
        """A new epoch, with ``workers`` workers: ``prefetch`` stays; the first round starts
        at the epoch's first batch (its start-up, workers spawning, is no part of a rate)."""
        self._workers = max(1, workers)
        self._round: tuple[float, float, float, int, int] | None = None
        self._done = 0
        self._grown_from = None

    def measured(self, batch_bytes: int) -> int | None:
        """The first batch's size: caps ``prefetch`` by the budget (never below the start);
        the new value if it changed."""
        fits = self._budget // max(1, batch_bytes * self._workers)
        self._cap = max(PREFETCH_START, min(PREFETCH_CAP, fits))
        if self.prefetch > self._cap:
            self.prefetch = self._cap
            return self.prefetch
        return None

    def received(
        self, at: float, stall: float, busy: float, admitted: int, blocked: int, window: int
    ) -> int | None:
        """The consumer received a batch at ``at``. ``stall`` and ``busy``: its waiting and
        own time so far; ``admitted`` and ``blocked``: batches admitted into the window so
        far, and how many of them waited for a slot; ``window``: its size now. Returns the new
        ``prefetch`` when it changes."""
        if self._round is None:
            self._round = (at, stall, busy, admitted, blocked)
            return None
        self._done += 1
        if self._done < max(window, MIN_ROUND):
            return None
        t0, stall0, busy0, admitted0, blocked0 = self._round
        rate = self._done / max(at - t0, 1e-9)
        self._round, self._done = (at, stall, busy, admitted, blocked), 0
        waited, consumer = stall - stall0, (stall - stall0) + (busy - busy0)
        stalled = consumer > 0 and waited >= STALLED * consumer
        full = admitted > admitted0 and (blocked - blocked0) >= WINDOW_FULL * (admitted - admitted0)
        before = self.prefetch
        if at < self._held_until:
            self._grown_from = None
        elif self._grown_from is not None and rate < self._grown_from[1] * GAIN:
            self.prefetch, self._grown_from = self._grown_from[0], None
            self._held_until = at + HOLD_S
        elif stalled and full and self.prefetch < self._cap:
            self._grown_from = (self.prefetch, rate)
            self.prefetch = min(self._cap, 2 * self.prefetch)
        else:
            self._grown_from = None
        return self.prefetch if self.prefetch != before else None
