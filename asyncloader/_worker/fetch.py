"""Bounded async fan-out: fetches the samples of every batch on the event loop.

Per sample, so one slow sample never holds a whole batch's worth of requests back. Samples
wait in one FIFO queue (earlier batches first) served by at most ``io_concurrency`` runner
tasks; each runner fetches one sample at a time, so ``fetching <= runners <= io_concurrency``
at every await point. Runners are started as samples arrive, park when the queue is empty, are
woken by the next batch, and end once :meth:`Fetcher.close` says no batch will come: there is
no task, semaphore or TaskGroup per sample.

::

    fetch(seq 0) ─► queue: [batch 0: pos 0 1 …] [batch 1: pos 0 1 …]  ◄─ fetch(seq 1)
                          │ the next position taken by a free runner, oldest batch first
                    runner 0 … runner io_concurrency-1   (await get(index), one at a time;
                          │                               parked while the queue is empty)
                          │ the batch's last sample
                    batch future ─► fetch(seq) returns the samples (or the first Failure)

Liveness: while samples are queued and fewer than the limit are being fetched, a runner
will take one. A runner is *active* (fetching, or about to take a sample, park or end) or
*parked*, and ``active >= min(limit, fetching + queued)`` holds at every await point: the
active runners not fetching cover the queued samples, up to the room under the limit.

- A wake-up is a slot handed over, not a request: whoever wakes a runner counts it active
  before it runs, so what it does next (take, park, end) follows the rules below.
- An active runner parks only when nothing is queued; it ends only when ``active > limit``
  (``active >= limit`` still holds after), or when nothing is queued and ``close()`` was
  called or enough runners are parked already.
- Everything that adds work or room (a batch queued, the limit raised) calls ``_serve``,
  which wakes or starts runners until the inequality holds.
- Taking a sample keeps ``fetching + queued``; a fetch ending, a failed or dropped batch and
  a lower limit only shrink the right-hand side.

An active runner waits on nothing but its own fetch, so a queued sample is taken at once
when there is room, and otherwise as soon as a fetch ends. Only the epoch's cancellation
ends runners otherwise.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader._base import Failure, Samples, Skip, Trimmed, tracing
from asyncloader._tuning import EpochMeter, FetchTuner, now
from asyncloader.errors import AsyncLoaderError

if TYPE_CHECKING:
    from asyncloader._worker.getitems import BatchFetcher

Spawn = Callable[..., "asyncio.Task[None]"]


class _Batch:
    """One batch's samples as they arrive; ``done`` resolves to them or to a Failure."""

    __slots__ = ("done", "indices", "left", "next", "samples", "seq", "size", "skips")

    def __init__(self, seq: int, indices: Sequence[Any], done: asyncio.Future[Any]) -> None:
        self.seq = seq
        self.indices = indices
        self.size = self.left = len(indices)
        self.samples: list[Any] = [None] * self.size
        self.next = 0  # the position a runner takes next
        self.done = done
        self.skips: dict[int, Skip] = {}  # position -> the sample left out (on_error="skip")

    def place(self, pos: int, sample: Any) -> None:
        """Sample ``pos`` arrived: kept unless the batch failed meanwhile; the last one in
        completes the batch."""
        if not self.done.done():
            self.samples[pos] = sample
            self.left -= 1
            if self.left == 0:
                self.complete()

    def complete(self) -> None:
        """Resolves ``done`` once every sample is in or left out (``left == 0``)."""
        if not self.skips:
            self.done.set_result(self.samples)
            return
        kept = [pos for pos in range(self.size) if pos not in self.skips]
        self.done.set_result(
            Trimmed(
                [self.samples[pos] for pos in kept],
                [self.skips[pos] for pos in sorted(self.skips)],
                empty=not kept,
                indices=[self.indices[pos] for pos in kept],
            )
        )


class Fetcher:
    """Fetches samples with ``get(index)``, at most ``io_concurrency`` at once.

    Args:
        get: Returns an awaitable of the sample at ``index`` (a coroutine for async sources, a
            thread-pool future for sync ones).
        io_concurrency: The bound on samples being fetched at once.
        spawn: Starts a runner task (``TaskGroup.create_task``): runners belong to the epoch,
            so a failure or cancellation of the epoch reaches them. Call :meth:`close` once
            the last batch was passed to :meth:`fetch`, or parked runners wait for ever.
        skip: ``on_error="skip"``: a sample that raises is left out of its batch instead of
            failing it (:meth:`fetch` then returns a :class:`Trimmed`).
        meter: Told each sample's latency and the samples in flight.
        tuner: ``io_concurrency="auto"``: moves the limit (from ``tuner.limit``, at most
            ``io_concurrency``) as samples complete; ``on_limit(new)`` is told each move.
    """

    def __init__(
        self,
        get: Callable[[Any], Awaitable[Any]],
        io_concurrency: int,
        spawn: Spawn,
        skip: bool = False,
        meter: EpochMeter | None = None,
        tuner: FetchTuner | None = None,
        on_limit: Callable[[int], None] | None = None,
    ) -> None:
        self._get = get
        self._meter = meter
        self._tuner, self._on_limit = tuner, on_limit
        self._skip = skip
        self._limit = io_concurrency if tuner is None else tuner.limit
        self._spawn = spawn
        self._queue: deque[_Batch] = deque()  # batches with positions not yet taken
        self.queued = 0  # their positions not yet taken (failed batches' included)
        # Each parked runner's wake-up, oldest first; a cancelled runner's stays, done.
        self._wakeups: deque[asyncio.Future[None]] = deque()
        self.active = 0  # runners not parked (see the module's liveness rules)
        self.parked = 0
        self._spawned = 0
        self._closed = False
        self.fetching = 0
        self.max_fetching = 0

    async def fetch(self, seq: int, indices: Sequence[Any]) -> list[Any] | Failure | Trimmed:
        """Returns the samples of batch ``seq`` in ``indices`` order, or the first Failure
        (with ``skip``: a Trimmed of the samples kept, when some were left out).

        Once one sample failed, the batch's samples still queued are not fetched.
        """
        if not indices:
            return []
        batch = _Batch(seq, indices, asyncio.get_running_loop().create_future())
        self._queue.append(batch)
        self.queued += batch.size
        self._serve()
        try:
            result: list[Any] | Failure | Trimmed = await batch.done
            return result
        finally:
            if not batch.done.done():  # cancelled: drop what is still queued of it
                batch.done.cancel()

    def close(self) -> None:
        """No more batches will come: runners end once the queue is empty."""
        self._closed = True
        self._wake(self.parked)

    @property
    def limit(self) -> int:
        """Samples at most being fetched at once now."""
        return self._limit

    def _serve(self) -> None:
        """Makes ``active >= min(limit, fetching + queued)``: wakes parked runners, then
        starts new ones."""
        need = min(self._limit, self.fetching + self.queued) - self.active
        if need <= 0:
            return
        need -= self._wake(need)
        for _ in range(need):
            try:
                self._spawn(self._run(), name=f"fetch-runner:{self._spawned}")
            except RuntimeError:  # the TaskGroup is shutting down: this task is cancelled too
                return
            self._spawned += 1
            self.active += 1

    def _wake(self, n: int) -> int:
        """Hands up to ``n`` parked runners a slot each (counted active from now)."""
        woken = 0
        wakeups = self._wakeups
        while woken < n and wakeups:
            wakeup = wakeups.popleft()
            if not wakeup.done():  # done: its runner was cancelled while parked
                wakeup.set_result(None)
                woken += 1
        self.parked -= woken
        self.active += woken
        return woken

    async def _park(self) -> None:
        """Waits, counted parked, until :meth:`_wake` counts it active again."""
        wakeup = asyncio.get_running_loop().create_future()
        self._wakeups.append(wakeup)
        self.active -= 1
        self.parked += 1
        try:
            await wakeup
        except asyncio.CancelledError:
            if wakeup.cancelled():  # not woken: still counted parked
                self.parked -= 1
                self.active += 1  # _run's finally counts it out
            raise

    async def _run(self) -> None:
        """Fetches queued samples one at a time; parks while there are none."""
        queue, get, meter = self._queue, self._get, self._meter
        try:
            while True:
                if self.active > self._limit:  # the tuner lowered the limit
                    return
                if not queue:
                    if self._closed or self.parked >= self._limit:
                        return
                    await self._park()
                    continue
                taken = self._take(queue)
                if taken is None:
                    continue
                batch, pos = taken
                began = now() if meter is not None else 0.0  # the tuner needs only the end
                try:
                    sample = await get(batch.indices[pos])
                except asyncio.CancelledError as exc:
                    self._cancelled(batch, exc, pos)
                    continue
                except Exception as exc:
                    self._fail(batch, exc, pos)
                    continue
                finally:
                    self.fetching -= 1
                    ended = now() if meter is not None or self._tuner is not None else 0.0
                    if meter is not None:
                        meter.fetch.add(ended - began)
                if self._tuner is not None:
                    self._retune(ended, sample)
                batch.place(pos, sample)
        finally:
            self.active -= 1

    def _take(self, queue: deque[_Batch]) -> tuple[_Batch, int] | None:
        """The next sample to fetch, ``(batch, position)``, counted as fetching; None when
        the first queued batch had failed or was cancelled (the rest of it is dropped)."""
        batch = queue[0]
        if batch.done.done():
            queue.popleft()
            self.queued -= batch.size - batch.next
            return None
        pos = batch.next
        batch.next = pos + 1
        self.queued -= 1
        if pos + 1 == batch.size:
            queue.popleft()
        fetching = self.fetching = self.fetching + 1
        if fetching > self.max_fetching:
            self.max_fetching = fetching
        return batch, pos

    def _cancelled(self, batch: _Batch, exc: asyncio.CancelledError, pos: int) -> None:
        """A sample's fetch raised CancelledError: re-raised when the epoch is being
        cancelled; else the source raised it of its own (some clients do on timeouts) and
        the sample failed, reported, never lost quietly."""
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise exc
        error = AsyncLoaderError("the source raised CancelledError for this sample")
        error.__cause__ = exc
        self._fail(batch, error, pos)

    def _retune(self, at: float, sample: Any) -> None:
        assert self._tuner is not None
        new = self._tuner.completed(self.queued > 0, at, sample)
        if new is None:
            return
        grew, self._limit = new > self._limit, new
        if self._on_limit is not None:
            self._on_limit(new)
        if grew:  # start runners for the samples waiting for one
            self._serve()

    def _fail(self, batch: _Batch, exc: BaseException, pos: int) -> None:
        if batch.done.done():
            return
        index = batch.indices[pos]
        if self._skip:
            batch.skips[pos] = Skip.capture(exc, "fetch", batch.seq, batch.indices, index)
            batch.left -= 1
            if batch.left == 0:
                batch.complete()
        else:
            batch.done.set_result(Failure.capture(exc, "fetch", batch.seq, batch.indices, index))


async def fetch_then_run(
    fetcher: Fetcher | BatchFetcher | None,
    run: Callable[[int, Sequence[Any], list[Any] | None], Awaitable[Any]],
    seq: int,
    indices: Sequence[Any],
    samples: Samples | None,
) -> Any:
    """Batch ``seq`` through both halves: its samples from ``fetcher`` (per sample, or one
    ``__getitems__`` call for a :class:`~asyncloader._worker.getitems.BatchFetcher`; unless
    given, or the engine fetches them), then ``run(seq, indices, samples)`` (transform and
    collate).

    Returns the batch, its Failure, or under ``on_error="skip"`` a Trimmed that gathers the
    samples both halves left out. A batch whose samples were all left out is not run.
    """
    result: Any = samples
    fetched: Trimmed | None = None  # the samples fetch left out (on_error="skip")
    if samples is None and fetcher is not None:
        tracing.begin("fetch", "fetch", seq, len(indices))
        try:
            result = await fetcher.fetch(seq, indices)
        finally:
            tracing.end("fetch", "fetch", seq)
        if type(result) is Trimmed:
            fetched, indices, result = result, result.indices, result.batch
    if fetched is not None and fetched.empty:
        return fetched
    if isinstance(result, Failure):
        return result
    result = await run(seq, indices, result)
    if fetched is None:
        return result
    fetched.batch = result
    if type(result) is Trimmed:
        fetched.skips += result.skips
        fetched.batch, fetched.empty = result.batch, result.empty
    return fetched
