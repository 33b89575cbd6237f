"""The running epoch: its stages wired inside one TaskGroup, its resources in one exit stack.

::

    sampler / iterable ─► admit (window permit) ─► fetch (loop, ≤ io_concurrency samples)
                          └──────────────── batch:{seq} task ───────────────┘
                                                 │
                          transform + collate (engine, ≤ transform_window batches)
                                                 │
                          ReorderBuffer ─► [device thread] ─► consumer (permit returned on
                                                              hand-over)

Window invariant: ``permits.value + ahead == size + debt`` (:class:`~asyncloader._base.window.
Window`), where ``ahead`` counts the batches taken from the sampler and not yet handed to the
consumer (being fetched, in the engine, in the reorder buffer, or in a hand-over queue). So
memory held ahead of the consumer is bounded by the largest size the window had, at most
``options.window`` batches, whatever the consumer's speed or the order batches complete in.
The "auto" settings move the size while the epoch runs: ``io_concurrency`` with the fetch
limit, ``prefetch`` with the consumer's stalls (``_tuning.autosize``), the engine's room with it.

A stage exception inside a batch becomes a Failure delivered at that batch's turn: the
iterator raises it from that step and the epoch goes on with the next batch, as DataLoader
does. Anything else (the sampler raising, a worker crash) fails the TaskGroup, which cancels
every stage task and surfaces the first error to the consumer: the epoch ends there.

Every resource of the epoch (its threads, its worker lease, the source's puller) is entered
into one ``AsyncExitStack`` as it starts, so stopping, on every path, is that stack's exit: in
reverse order of starting, after the stage tasks ended and the consumer was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from asyncloader._base import (
    EMPTY,
    SKIP_LOG_LENGTH,
    Failure,
    ReorderBuffer,
    Samples,
    Seeds,
    SkipLedger,
    Trimmed,
    Window,
    loop_registered,
    nbytes,
    tracing,
    unwrap_group,
)
from asyncloader._checkpoint import Progress
from asyncloader._config import Options
from asyncloader._engines import WorkerLease
from asyncloader._pipeline.batches import Made
from asyncloader._pipeline.epoch_start import EpochStart, SamplerCursor
from asyncloader._pipeline.epoch_stats import epoch_stats
from asyncloader._pipeline.length import LengthCheck, ReportedLength
from asyncloader._pipeline.stages import (
    device_pump,
    fetches_on_loop,
    open_batches,
    open_device,
    open_fetch,
    open_transform,
)
from asyncloader._pipeline.stall_dump import Parts, watch_stalls
from asyncloader._pipeline.transform import Transformer
from asyncloader._tuning import EpochMeter, FetchTuner, LoaderStats, PrefetchTuner, now
from asyncloader._worker import BatchFetcher, Fetcher, fetch_then_run
from asyncloader.errors import AsyncLoaderError, LoaderTimeoutError

#: The longest ``state_dict()`` waits for the workers to open their iterations of the source
#: (without a ``timeout``); past it, it returns the state without what they opened.
SETTLE_S = 30.0


class Epoch:
    """One pass over the source, consumed by exactly one iterator.

    Runs on one event loop (the ``asyncloader-loop`` thread's, or the caller's for
    ``async for``). Of its members, :attr:`progress`, :attr:`start_info`, :meth:`timed_out`
    and :attr:`stats` may be used from the consumer's thread too: ``progress`` has its own lock,
    ``start_info`` never changes, and the other two only read counters and dict entries.

    Args:
        options: The loader's validated options.
        start: How the epoch begins (seed, RNG state, started sampler, resume point).
        lease: The worker pool of this epoch, when ``num_workers > 0``.
        skip_log: The loader's ``skip_log``, where the ledger of an ``on_error="skip"`` epoch
            keeps the last few skips.
        tuner: ``io_concurrency="auto"``: the loader's fetch tuner, kept across its epochs.
        prefetch_tuner: ``prefetch="auto"``: the loader's, kept across its epochs.
        reported_len: What ``len(loader)`` answered before the epoch, for an iterable
            source: each batch past it warns (:class:`~asyncloader._pipeline.length.LengthCheck`).
    """

    def __init__(
        self,
        options: Options,
        start: EpochStart,
        lease: WorkerLease | None,
        skip_log: deque[tuple[Any, str]] | None = None,
        tuner: FetchTuner | None = None,
        reported_len: ReportedLength | None = None,
        prefetch_tuner: PrefetchTuner | None = None,
    ) -> None:
        self._options = options
        self._length: LengthCheck | None = None
        if reported_len is not None:
            self._length = LengthCheck(
                reported_len,
                options.dataset,
                options.batch_size not in (None, 1),
                options.worker_streams,
                options.loader_name,
            )
        # on_error="skip": the consumer's iterator settles each Trimmed batch here.
        self.skips: SkipLedger | None = None
        if options.max_skipped is not None:
            recent = deque(maxlen=SKIP_LOG_LENGTH) if skip_log is None else skip_log
            self.skips = SkipLedger(options.max_skipped, recent)
        self.start_info = start
        self.progress = Progress(start.resume, start.source_state, options.worker_streams)
        self._scheduled = False  # the stage tasks run, or will without the consumer's help
        self._own_loop = False  # on the loader's loop thread, where nothing else runs
        self._lease = lease
        self._tuner = tuner if fetches_on_loop(options) else None
        if self._tuner is not None:
            self._tuner.restart(now())
        # Each worker's own iteration is asked prefetch batches ahead once: it stays there.
        self._prefetcher = prefetch_tuner if not options.worker_streams else None
        if self._prefetcher is not None:
            self._prefetcher.restart(options.num_workers)
        self.prefetch = self._prefetcher.prefetch if self._prefetcher else options.prefetch
        self._fetcher: Fetcher | BatchFetcher | None = None
        self._transformer: Transformer | None = None
        self._window = Window(self._window_size())
        self._buffer = ReorderBuffer(options.in_order, start.resume.start, start.resume.skip)
        # With a device stage the consumer reads the device thread's output, in order.
        self._out = ReorderBuffer(in_order=False) if options.device_stage else self._buffer
        self._device_room = asyncio.Semaphore(options.device_depth or 1)
        self._inflight: dict[int, Sequence[Any]] = {}  # seq -> indices, until handed over
        self.meter = EpochMeter()
        self._sized = False  # the first batch was measured (meter.batch_bytes)
        self._task: asyncio.Task[None] | None = None
        self._asks = 0  # the consumer's calls for a batch (its thread); see parts()
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on, once started

    @property
    def options(self) -> Options:
        """The epoch's options (under ``num_workers="auto"``, with its count of workers)."""
        return self._options

    # -- consumer side -------------------------------------------------------------------------

    def scheduled(self) -> None:
        """The epoch is to run on another thread's loop (a ``for`` epoch): it starts without
        the consumer asking for a batch."""
        self._scheduled = self._own_loop = True

    def settle_source(self) -> None:
        """Waits until the workers have opened their iterations of the source
        (``fetch_in_workers``), so that a ``state_dict()`` right after ``iter()`` holds what
        each worker's ``__iter__`` made, as it does without workers. Returns at once where
        nothing would open meanwhile (an ``async for`` epoch not started yet) or where waiting
        would stall the epoch (on its own loop); waits at most ``timeout``, or
        :data:`SETTLE_S` (the state is exact either way: only less informative)."""
        if self._may_wait():
            self.progress.wait_source_opened(self._options.timeout or SETTLE_S)

    def worker_processes(self) -> list[Any]:
        """The epoch's worker processes (DataLoader's ``iterator._workers``), waiting for them
        to start as :meth:`settle_source` waits; ``[]`` without any (or Ray actors)."""
        if self._lease is None:
            return []
        if self._may_wait():
            self._lease.ready.wait(self._options.timeout or SETTLE_S)
        return list(self._lease.processes)

    def _may_wait(self) -> bool:
        """The epoch runs, or will, and not on the caller's loop (waiting would stall it)."""
        if not self._scheduled:
            return False
        try:
            return asyncio.get_running_loop() is not self.loop
        except RuntimeError:
            return True  # not on any loop

    def took_every_batch(self) -> bool:
        """The consumer received every batch of this map-style epoch, whether or not it went
        on to see the end (a trainer that stops after ``len(loader)`` batches)."""
        options = self._options
        sampler = options.batch_sampler if options.batch_sampler is not None else options.sampler
        try:
            total = len(sampler)
        except TypeError:
            return False
        return options.kind.is_map and self.progress.next_batch >= total

    def start(self) -> asyncio.Task[None]:
        """Starts the stage tasks on the running loop."""
        self._scheduled = True
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._run(), name="asyncloader-epoch")
        return self._task

    async def next(self) -> tuple[int, Any]:
        """Waits for the next ``(seq, batch)``; the batch is a :class:`Failure` when one of its
        stages raised (the iterator raises it, and the epoch goes on). Its permit stays taken
        until :meth:`release`.

        Raises:
            StopAsyncIteration: The epoch is complete.
            Exception: What ended the epoch (a sampler error, a crashed worker).
        """
        try:
            seq, item = await self._out.get()
        except StopAsyncIteration:
            self.meter.end()
            raise
        indices = self._inflight.pop(seq, None)
        if indices is not None:
            self.meter.samples += len(indices)
        if not self._sized and not isinstance(item, Failure):
            self._measured(item)
        if tracing.ACTIVE is not None:
            self._trace_counters()
        return seq, item

    def _trace_counters(self) -> None:
        """The pipeline's levels as a batch is handed over: the trace's counter tracks."""
        window = self._window
        tracing.counter(
            "batches", {"window": window.size, "ahead": window.ahead, "ready": self._buffer.ready}
        )
        tracing.counter("prefetch", {"per worker": self.prefetch})
        fetcher = self._fetcher
        if isinstance(fetcher, Fetcher):
            fetching = {"in flight": fetcher.fetching, "limit": fetcher.limit}
            tracing.counter("samples", fetching)

    def _measured(self, item: Any) -> None:
        """The first batch's size, once (a batch of no tensors or arrays measures 0 bytes):
        ``prefetch="auto"`` keeps the window within the budget."""
        batch = item.batch if type(item) is Trimmed else item
        if batch is None:  # every sample of it was skipped: the next one is measured
            return
        self._sized = True
        self.meter.batch_bytes = nbytes(batch)
        tuner, size = self._prefetcher, self.meter.batch_bytes
        if tuner is not None and size and tuner.measured(size) is not None:
            self._resize("prefetch: the first batch measured against the memory budget")

    def outcome(self, seq: int, item: Any) -> Any:
        """What the consumer gets for batch ``seq`` (``item`` from :meth:`next`), on its thread.

        Returns the batch, or :data:`~asyncloader._base.skipping.EMPTY` when ``on_error="skip"``
        left no
        sample in it (received, nothing to yield). Raises the batch's own error when one of
        its stages failed: that step only; the next goes on with the next batch.
        """
        if type(item) is Trimmed:  # on_error="skip" left samples out
            assert self.skips is not None
            item = self.skips.settle(seq, item)
        if isinstance(item, Failure):
            item.reraise()
        if self._length is not None and item is not EMPTY:
            self._length.handed_over()
        return item

    def asked(self) -> None:
        """The consumer asks for its next batch (on its thread): the workers may reuse the
        shared memory of the batches it has let go since."""
        self._asks += 1
        if self._transformer is not None:
            self._transformer.sweep()

    def release(self) -> None:
        """The consumer has received a batch: return its permit to the window (on the loop).

        Liveness: each batch received returns exactly one window permit and, with a device
        stage, one device-room permit (both iterators call this before the batch's outcome
        can raise); the prefetch tuner is asked after, so a shallowing never takes back a
        permit already given."""
        at = now()
        self.meter.waiting.add(-1, at)
        window = self._window
        window.release()
        if self._out is not self._buffer:
            self._device_room.release()
        if self._prefetcher is not None:
            meter = self.meter
            moved = self._prefetcher.received(
                at, meter.stall, meter.busy, window.admitted, window.blocked, window.size
            )
            if moved is not None:
                self._resize("prefetch: the consumer's waits against the pipeline's")

    def ahead_reached(self, batches: int) -> threading.Event:
        """Set once ``batches`` batches were ahead of the consumer at once (``max_ahead``),
        from any thread: for observing how far the pipeline runs ahead (tests, diagnostics)."""
        return self._window.reached(batches)

    def parts(self) -> Parts:
        """What each stage holds now, for the stall dump (:mod:`~asyncloader._pipeline.
        stall_dump`), which reads it on the loop's thread."""
        return Parts(
            self._options, self.start_info.number, self.meter, self.progress, self._window,
            self._buffer, self._out, self._fetcher, self._transformer, self._device_room,
            self.prefetch, self._inflight, self._asks > self.progress.batches, self.loop,
            self._task,
        )  # fmt: skip

    def timed_out(self) -> LoaderTimeoutError:
        """The error for a consumer that waited ``timeout`` seconds, naming what it waited for
        (worded as DataLoader's, with the user's loader class)."""
        seq = self._buffer.next_seq
        if seq is None:
            waited = "the next batch to complete (in_order=False)"
        elif (indices := self._inflight.get(seq)) is None:
            waited = f"batch {seq}, not yet taken from the sampler"
        else:
            waited = f"batch {seq} with indices {list(indices)[:16]}"
        options = self._options
        return LoaderTimeoutError(
            f"{options.loader_name} timed out after {options.timeout:g} seconds: no batch "
            f"while waiting for {waited}"
        )

    @property
    def stats(self) -> LoaderStats:
        """The epoch's counters and per-stage figures now (see :func:`~asyncloader._pipeline.
        epoch_stats.epoch_stats`)."""
        return epoch_stats(
            self._options, self.meter, self.progress, self._window, self._fetcher, self.skips,
            self.prefetch, self.start_info.source_state,
        )  # fmt: skip

    async def aclose(self) -> None:
        """Cancels the stage tasks and waits until threads and processes are joined, the
        workers forked at ``iter()`` too when the epoch was closed before it used them."""
        task = self._task
        if task is not None:
            if not task.done() and not task.cancelling():  # a second cancel would cut into
                task.cancel()  # the cleanup the first began (a racing aclose())
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
        if self._lease is not None:  # a no-op once the stages entered and left it
            await self._lease.__aexit__()

    def abandon(self) -> None:
        """Shuts down the workers of an epoch that never started (an ``async for`` iterator
        dropped or closed before its first batch was asked for). Blocking; a no-op once it
        has started (:meth:`aclose` closes it then)."""
        if self._task is None and self._lease is not None:
            self._lease.abandon()

    # -- producer side -------------------------------------------------------------------------

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(loop_registered(asyncio.get_running_loop()))
            stack.enter_context(watch_stalls(self._options.stall_dump, self.parts))
            stack.callback(self._let_sampler_go)
            stack.callback(self.progress.source_opened)  # never opening: nobody waits
            try:
                await self._flow(stack)
            except asyncio.CancelledError:
                self._fail(AsyncLoaderError("the epoch was closed before it finished"))
                raise
            except BaseException as exc:
                self._fail(unwrap_group(exc))

    async def _flow(self, stack: contextlib.AsyncExitStack) -> None:
        """Opens the stages into ``stack`` and admits batches until the source ends.

        Liveness: each turn takes one window permit and hands it to a ``batch:{seq}`` task,
        which ends in the reorder buffer or fails the TaskGroup (an engine's own cancel
        included), or gives it back when the source ended, then declares the total. So
        while the consumer waits, its batch is in flight, or the buffer finishes or fails.
        """
        options, seeds, meter = self._options, self._seeds, self.meter
        get, self._fetcher = open_fetch(options, stack, seeds, meter)
        device = open_device(options, stack)
        self._transformer = transformer = await open_transform(
            options, stack, self._lease, self._own_loop, seeds,
            options.engine_window_for(self.prefetch), self._inflight, meter,
        )  # fmt: skip
        numbered = open_batches(options, stack, self.start_info, self.progress, transformer)
        batches = await stack.enter_async_context(contextlib.aclosing(numbered))
        async with asyncio.TaskGroup() as tg:
            if get is not None:
                skip = self.skips is not None
                self._fetcher = Fetcher(
                    get,
                    options.fetch_concurrency,
                    tg.create_task,
                    skip,
                    meter,
                    self._tuner,
                    lambda limit: self._resize("io limit: samples/s at the last limit"),
                )
            if device is not None:
                pump = device_pump(
                    device, self._device_room, self._buffer, self._out, self._inflight, meter
                )
                tg.create_task(pump, name="device")
            admitted = 0
            while True:
                asked = now()
                await self._window.admit()
                if meter.waiting.level:  # the slot freed up while batches sat ready
                    meter.backpressure += now() - asked
                item = await anext(batches, None)
                if item is None:
                    self._window.release()
                    break
                seq, indices, samples = item
                self._inflight[seq] = indices
                process = self._process(transformer, seq, indices, samples)
                tg.create_task(process, name=f"batch:{seq}")
                admitted += 1
            if self._fetcher is not None:
                self._fetcher.close()
            self._buffer.finish(admitted)

    def _let_sampler_go(self) -> None:
        """At the end: frees the sampler's indices, unless the next epoch must first run it to
        its end (see :class:`~asyncloader._pipeline.epoch_start.SamplerCursor`)."""
        cursor = self.start_info.index_iter
        if isinstance(cursor, SamplerCursor) and not self.took_every_batch():
            cursor.close()

    def _fail(self, exc: BaseException) -> None:
        self._buffer.fail(exc)
        self._out.fail(exc)

    @property
    def _seeds(self) -> Seeds:
        """How this epoch's batches seed the global RNGs (see :mod:`asyncloader._base.seeding`)."""
        return Seeds.of(self.start_info.seed, self._options.seed_per_sample)

    def _window_size(self) -> int:
        """The window for the fetch limit and ``prefetch`` now. Under ``io_concurrency="auto"``
        it has room to queue as many samples as are in flight, so a fetch held back by its
        limit shows it (see ``_tuning.io_limit``)."""
        options = self._options
        if self._tuner is not None:
            fetching = 2 * (self._fetcher.limit if self._fetcher else self._tuner.limit)
        else:
            fetching = options.fetch_room
        return options.window_for(fetching, self.prefetch)

    def _resize(self, reason: str) -> None:
        """A tuner moved the fetch limit or ``prefetch``: the window and the engine's room
        follow.

        Liveness: a move only resizes. A deeper window releases permits at once (waking the
        admission loop); a shallower one is debt that batches in flight pay as the consumer
        receives them. Sizes are at least 1, so while ``ahead`` is below the new size a
        permit is free; nothing here waits."""
        if self._prefetcher is not None:
            self.prefetch = self._prefetcher.prefetch
        size = self._window_size()
        self._window.resize(size)
        if self._transformer is not None:
            self._transformer.resize(self._options.engine_window_for(self.prefetch))
        limit = self._tuner.limit if self._tuner is not None else None
        self.meter.tuned.append((now(), limit, self.prefetch, size))
        decision = {"reason": reason, "io limit": limit, "prefetch": self.prefetch, "window": size}
        tracing.instant("tuner", "tuner", decision)

    async def _process(
        self,
        transformer: Transformer,
        seq: int,
        indices: Sequence[Any],
        samples: Samples | Made | None,
    ) -> None:
        """Takes one batch through fetch and transform (or receives it made by a worker's
        stream) and into the reorder buffer."""
        if isinstance(samples, Made):
            result = transformer.received(samples.result)
        else:
            result = await fetch_then_run(self._fetcher, transformer.run, seq, indices, samples)
        self.meter.waiting.add(1, now())
        self._buffer.put(seq, result)
