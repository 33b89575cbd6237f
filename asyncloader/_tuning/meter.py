"""Per-stage measurements of one epoch, read by ``loader.stats`` and ``loader.report()``.

Cheap by construction: a ``perf_counter()`` read and a few float operations per event, no
locks. Each figure has one writer (the loop's thread, or the consumer's for the consumer
clock); readers on other threads see whole values (a float or int read under the GIL), so a
snapshot taken mid-epoch is consistent to within the events in flight.

Stages and what is measured (all in the training process):

- fetch (samples fetched on the event loop): each sample's latency; the mean in flight is
  their total over the elapsed time (Little's law), against ``io_concurrency``;
- engine (batches in the workers, the executor or the loader's transform thread): each
  batch's round trip, and so the mean batches in it, against its window;
- waiting: batches done and not yet taken by the consumer (reorder buffer and device stage);
- device: each batch's pin, copy and ``device_transform``;
- consumer: the time it waited inside ``next()`` (stall; each wait kept for its
  percentiles, also per worker: the one that made the batch waited for) and spent between
  batches (its own step), and the time the loader's
  admission waited for a slot that a batch ready for the consumer held (backpressure);
- tuning: the last :data:`TUNED_KEPT` moves of the ``"auto"`` settings (the io limit,
  ``prefetch``) and the window they gave, for the stall dump (a few an epoch, not per event).
"""

from __future__ import annotations

import time
from array import array
from collections import deque

from asyncloader._base import RETRIES

RESERVOIR = 2048  # durations kept per stage for the percentiles: the most recent ones
SAMPLE_EVERY = 4  # of which every 4th is kept
TUNED_KEPT = 16  # the last moves of the "auto" settings kept (EpochMeter.tuned)

now = time.perf_counter


class Level:
    """A count over time (batches waiting): its value, its high-water mark and its
    time-weighted mean since ``start``."""

    __slots__ = ("_area", "_since", "_start", "level", "peak")

    def __init__(self, start: float) -> None:
        self.level = self.peak = 0
        self._area, self._since, self._start = 0.0, start, start

    def add(self, delta: int, at: float) -> None:
        self._area += self.level * (at - self._since)
        self._since = at
        self.level += delta
        if self.level > self.peak:
            self.peak = self.level

    def mean(self, at: float) -> float:
        span = at - self._start
        area = self._area + self.level * (at - self._since)
        return area / span if span > 0 else float(self.level)


class Durations:
    """All durations' count and total, and every ``every``-th of the recent ones (the last
    :data:`RESERVOIR` so kept) for percentiles. Adding one is a few operations: it runs once
    per sample fetched."""

    __slots__ = ("_every", "_ring", "count", "total")

    def __init__(self, every: int = SAMPLE_EVERY) -> None:
        self._ring = array("d", bytes(8 * RESERVOIR))
        self._every = every
        self.count, self.total = 0, 0.0

    def add(self, seconds: float) -> None:
        self.total += seconds
        i = self.count
        self.count = i + 1
        every = self._every
        if not i % every:
            self._ring[(i // every) % RESERVOIR] = seconds

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank) of the kept durations, or None without any."""
        kept = min(RESERVOIR, -(-self.count // self._every))
        if not kept:
            return None
        ordered = sorted(self._ring[:kept])
        return ordered[min(kept - 1, int(q * kept))]


class EpochMeter:
    """The measurements of one epoch (see the module docstring)."""

    def __init__(self) -> None:
        start = now()
        self.started = start
        self.ended: float | None = None
        self.fetch, self.engine = Durations(), Durations()
        self.waiting = Level(start)
        self.device = Durations()
        self.backpressure = 0.0
        # The consumer's thread writes first_batch, stall, busy, _handed and steady.
        self.first_batch: float | None = None
        self.stall = 0.0
        self.waits = Durations(every=1)  # each wait for a batch after the first
        #: Per worker, the waits for the batches it made (after the first batch).
        self.worker_waits: dict[int, Durations] = {}
        # seq -> the worker making it: written on the loop's thread, popped on the consumer's
        self._makers: dict[int, int] = {}
        #: The last batches' (the consumer's step before asking, its wait), in seconds.
        self.steps: deque[tuple[float, float]] = deque(maxlen=RESERVOIR)
        self.busy = 0.0
        self._handed = start
        #: At the first batch: (time, fetch total, engine total). Mean occupancies count from
        #: there, so start-up (workers spawning, connections opening) does not dilute them.
        self.steady: tuple[float, float, float] | None = None
        self.samples = 0
        self.batch_bytes = 0  # the first batch's tensors and arrays, once received
        self._retries_before = RETRIES[0]
        #: The last moves of the "auto" settings: (time, io limit or None, prefetch, window).
        self.tuned: deque[tuple[float, int | None, int, int]] = deque(maxlen=TUNED_KEPT)

    @property
    def retries(self) -> int:
        """Retries of this process's sources since the epoch began (any epoch running then
        counts too)."""
        return RETRIES[0] - self._retries_before

    def in_flight(self, at: float) -> tuple[float, float]:
        """Mean samples being fetched and batches in the engine since the first batch
        (Little's law: their total time over the time passed), or since the start before it."""
        t0, fetch0, engine0 = self.steady or (self.started, 0.0, 0.0)
        span = at - t0
        if span <= 0:
            return 0.0, 0.0
        return (self.fetch.total - fetch0) / span, (self.engine.total - engine0) / span

    def elapsed(self) -> float:
        return (self.ended or now()) - self.started

    def made_by(self, seq: int, worker: int | None) -> None:
        """Batch ``seq`` is being made by ``worker`` (None: the engine does not say)."""
        if worker is not None:
            self._makers[seq] = worker

    def received(self, started: float, seq: int = -1) -> None:
        """The consumer got batch ``seq`` (-1: unnamed) after waiting since ``started`` (its
        ``next()`` call). The first batch's wait (start-up: workers, connections) is kept
        apart."""
        got = now()
        worker = self._makers.pop(seq, None)
        if self.first_batch is None:
            self.first_batch = got - self.started
            self.steady = (got, self.fetch.total, self.engine.total)
        else:
            self.stall += got - started
            self.waits.add(got - started)
            if worker is not None:
                if worker not in self.worker_waits:
                    self.worker_waits[worker] = Durations(every=1)
                self.worker_waits[worker].add(got - started)
            self.busy += started - self._handed
            self.steps.append((started - self._handed, got - started))
        self._handed = got

    def end(self) -> None:
        if self.ended is None:
            self.ended = now()
