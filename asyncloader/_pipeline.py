"""Wires the stages of one epoch inside one TaskGroup: start-up, the data path, shutdown order.

::

    sampler / iterable ─► admit (window permit) ─► fetch (loop, ≤ io_concurrency samples)
                          └──────────────── batch:{seq} task ───────────────┘
                                                 │
                          transform + collate (executor, ≤ transform_window batches)
                                                 │
                          ReorderBuffer ─► consumer (permit returned on hand-over)

Window invariant: ``permits.value + ahead == window``, where ``ahead`` counts the batches taken
from the sampler and not yet handed to the consumer (being fetched, in the executor, in the
reorder buffer, or in a hand-over queue). So memory held ahead of the consumer is bounded by
``window`` batches whatever the consumer's speed or the order batches complete in.

A stage exception inside a batch becomes a Failure delivered at that batch's turn; anything
else (the sampler raising, a worker crash) fails the TaskGroup, which cancels every stage task
and surfaces the first error to the consumer. Shutdown, on every path, awaits the stage tasks
and then joins the epoch's threads and processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from asyncloader._batches import map_batches, stream_batches
from asyncloader._config import Config
from asyncloader._device import DeviceStage
from asyncloader._failure import Failure
from asyncloader._fetch import Fetcher
from asyncloader._pool import ProcessPool
from asyncloader._reorder import ReorderBuffer
from asyncloader._state import Cursor, Resume, is_stateful
from asyncloader._threads import loader_threads, run_in_thread
from asyncloader._transform import Transformer
from asyncloader._worker import BatchPlan, call_seeded
from asyncloader.errors import AsyncLoaderError
from asyncloader.sources import SourceKind

PoolProvider = Callable[[BatchPlan], Awaitable[tuple[ProcessPool, bool]]]


@dataclass(frozen=True, slots=True)
class LoaderStats:
    """Counters of a loader's current (or last) epoch.

    Attributes:
        window: Bound on batches taken from the sampler and not yet handed to the consumer.
        max_ahead: High-water mark of those batches; never exceeds ``window``.
        io_concurrency: Bound on samples being fetched at once on the event loop.
        max_fetching: High-water mark of those samples; never exceeds ``io_concurrency``.
        batches: Batches handed to the consumer.
    """

    window: int
    max_ahead: int
    io_concurrency: int
    max_fetching: int
    batches: int


def batch_plan(cfg: Config) -> BatchPlan:
    """What the executor does to each batch of a loader with options ``cfg``."""
    return BatchPlan(
        dataset=cfg.dataset if cfg.fetch_in_workers else None,
        transform=cfg.transform,
        collate=cfg.collate,
        batched=cfg.batched,
    )


def _unwrap(exc: BaseException) -> BaseException:
    """The first leaf of a TaskGroup's exception group: the error that started the failure."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class Epoch:
    """One pass over the source, consumed by exactly one iterator.

    Args:
        config: The loader's validated options.
        seed: This epoch's seed (drawn from the loader's generator): per-sample seeds derive
            from it when ``seed_per_sample`` is on.
        rng: The RNG state the epoch's draws started from (kept for checkpoints).
        index_iter: The (batch) sampler's iterator, already started, for map-style sources.
        resume: Where a resumed epoch starts.
        acquire_pool: Returns the started process pool and whether this epoch owns it (and so
            shuts it down); only called when ``config.num_workers > 0``.
    """

    def __init__(
        self,
        config: Config,
        acquire_pool: PoolProvider,
        seed: int,
        rng: tuple[str, torch.Tensor] | None = None,
        index_iter: Iterator[Any] | None = None,
        resume: Resume | None = None,
    ) -> None:
        self._cfg = config
        self._seed = seed
        self.rng = rng
        self._acquire_pool = acquire_pool
        self._index_iter = index_iter
        self._resume = resume = resume or Resume()
        self._cursor = Cursor(resume.start, set(resume.skip))
        self.finished = False  # the consumer saw the end (set by the iterators)
        # An iterable source that keeps state: its state before each batch (pruned as the
        # consumer receives them), so a checkpoint can name the one before the next batch.
        self._states: dict[int, Any] | None = None
        self._first_seq = 0
        if not config.kind.is_map and is_stateful(config.dataset):
            if resume.source_state is not None:
                config.dataset.load_state_dict(resume.source_state)
                self._first_seq = resume.start
            self._states = {self._first_seq: config.dataset.state_dict()}
        self._buffer = ReorderBuffer(config.in_order, resume.start, resume.skip)
        # With a device stage the consumer reads the device thread's output, in order.
        self._out = ReorderBuffer(in_order=False) if config.device_stage else self._buffer
        self._device_slots = asyncio.Semaphore(config.device_depth or 1)
        self._permits = asyncio.Semaphore(config.window)
        self._ahead = 0
        self._max_ahead = 0
        self._batches = 0
        self._inflight: dict[int, Sequence[Any]] = {}
        self._get: Callable[[Any], Awaitable[Any]] | None = None  # fetch on the loop
        self._fetcher: Fetcher | None = None
        self._transformer: Transformer | None = None
        self._device: DeviceStage | None = None
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- consumer side -------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Starts the stage tasks on the running loop."""
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._run(), name="asyncloader-epoch")
        return self._task

    async def next(self) -> tuple[int, Any]:
        """Waits for the next ``(seq, batch)``. Its permit stays taken until :meth:`release`.

        Raises:
            StopAsyncIteration: The epoch is complete.
        """
        seq, item = await self._out.get()
        self._inflight.pop(seq, None)
        if isinstance(item, Failure):
            item.reraise()
        return seq, item

    def release(self) -> None:
        """The consumer has received a batch: return its permit to the window (on the loop)."""
        self._ahead -= 1
        self._permits.release()
        if self._out is not self._buffer:
            self._device_slots.release()

    def delivered(self, seq: int) -> None:
        """Records that the consumer received batch ``seq``; called on the consumer's thread."""
        self._batches += 1
        self._cursor.add(seq)
        if self._states is not None:
            for old in [k for k in list(self._states) if k < self._cursor.next]:
                self._states.pop(old, None)

    def checkpoint(self) -> dict[str, Any]:
        """What the consumer has received of this epoch, JSON-friendly (see ``_state``)."""
        cursor = self._cursor
        source_state = None
        if self._states is not None:
            source_state = self._states.get(cursor.next)
        return {
            "next_batch": cursor.next,
            "delivered_beyond": sorted(cursor.beyond),
            "source_state": source_state,
        }

    def describe_wait(self) -> str:
        """What the consumer is waiting for, for timeout messages."""
        seq = self._buffer.next_seq
        if seq is None:
            return "the next batch to complete (in_order=False)"
        indices = self._inflight.get(seq)
        if indices is None:
            return f"batch {seq}, not yet taken from the sampler"
        return f"batch {seq} with indices {list(indices)[:16]}"

    @property
    def stats(self) -> LoaderStats:
        cfg = self._cfg
        fetching = self._fetcher.max_fetching if self._fetcher else 0
        return LoaderStats(cfg.window, self._max_ahead, cfg.io_concurrency, fetching, self._batches)

    async def aclose(self) -> None:
        """Cancels the stage tasks and waits until threads and processes are joined."""
        task = self._task
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise

    # -- producer side -------------------------------------------------------------------------

    async def _admit(self) -> None:
        await self._permits.acquire()
        self._ahead += 1
        self._max_ahead = max(self._max_ahead, self._ahead)

    def _unadmit(self) -> None:
        self._ahead -= 1
        self._permits.release()

    async def _run(self) -> None:
        closers: list[Callable[[], None]] = []
        try:
            await self._set_up(closers)
            cfg = self._cfg
            if cfg.kind.is_map:
                assert self._index_iter is not None
                batches = map_batches(cfg, self._index_iter, self._resume)
            else:
                batches = stream_batches(cfg, self._resume, self._first_seq, self._states, closers)
            try:
                async with asyncio.TaskGroup() as tg:
                    if self._get is not None:
                        self._fetcher = Fetcher(self._get, cfg.io_concurrency, tg.create_task)
                    if self._device is not None:
                        tg.create_task(self._device_pump(self._device), name="device")
                    admitted = 0
                    while True:
                        await self._admit()
                        item = await anext(batches, None)
                        if item is None:
                            self._unadmit()
                            break
                        seq, indices, samples = item
                        self._inflight[seq] = indices
                        tg.create_task(self._process(seq, indices, samples), name=f"batch:{seq}")
                        admitted += 1
                    if self._fetcher is not None:
                        self._fetcher.close()
                    self._buffer.finish(admitted)
            finally:
                await batches.aclose()
        except asyncio.CancelledError:
            self._fail(AsyncLoaderError("the epoch was closed before it finished"))
            raise
        except BaseException as exc:
            self._fail(_unwrap(exc))
        finally:
            if closers:
                await run_in_thread(lambda: [c() for c in reversed(closers)], "asyncloader-reaper")
            # An epoch-owned pool's queues and locks are named semaphores in /dev/shm while
            # referenced: let them go with the epoch's run, not with the loader.
            self._transformer = None

    def _fail(self, exc: BaseException) -> None:
        self._buffer.fail(exc)
        self._out.fail(exc)

    async def _set_up(self, closers: list[Callable[[], None]]) -> None:
        """Prepares the fetch and the transformer, and registers how to tear them down."""
        cfg = self._cfg
        loop = asyncio.get_running_loop()
        epoch_seed = self._seed if cfg.seed_per_sample else None
        plan = batch_plan(cfg)
        if cfg.kind is SourceKind.ASYNC_MAP:
            self._get = cfg.dataset.__getitem__
        elif cfg.kind is SourceKind.MAP and not cfg.fetch_in_workers:
            threads = loader_threads(cfg.io_concurrency, "asyncloader-fetch")
            closers.append(lambda: threads.shutdown(wait=True, cancel_futures=True))
            getitem = cfg.dataset.__getitem__
            self._get = lambda index: loop.run_in_executor(
                threads, call_seeded, epoch_seed, index, getitem, index
            )
        if cfg.device_stage:
            device = DeviceStage(cfg.pin_memory and torch.cuda.is_available(), cfg.device)
            closers.append(device.close)
            self._device = device
        if cfg.num_workers > 0:
            pool, owned = await self._acquire_pool(plan)
            if owned:
                closers.append(pool.shutdown)
            self._transformer = Transformer(
                pool.executor,
                cfg.transform_window,
                None,
                epoch_seed,
                lambda: pool.describe_crash(self._inflight),
            )
        elif cfg.executor is not None:
            self._transformer = Transformer(cfg.executor, cfg.transform_window, plan, epoch_seed)
        else:
            thread = loader_threads(1, "asyncloader-transform")
            closers.append(lambda: thread.shutdown(wait=True, cancel_futures=True))
            self._transformer = Transformer(
                thread, cfg.transform_window, plan, epoch_seed, inline=True
            )

    async def _process(self, seq: int, indices: Sequence[Any], samples: list[Any] | None) -> None:
        """Takes one batch through fetch and transform and into the reorder buffer."""
        result: Any = samples
        if samples is None and self._fetcher is not None:
            result = await self._fetcher.fetch(seq, indices)
        if not isinstance(result, Failure):
            assert self._transformer is not None
            result = await self._transformer.run(seq, indices, result)
        self._buffer.put(seq, result)

    async def _device_pump(self, device: DeviceStage) -> None:
        """Moves batches, in order, from the reorder buffer through the device thread.

        Runs at most ``device_depth`` batches ahead of the consumer: a slot is taken before a
        batch leaves the reorder buffer and returned when the consumer receives it.
        """
        forwarded = 0
        while True:
            await self._device_slots.acquire()
            try:
                seq, item = await self._buffer.get()
            except StopAsyncIteration:
                self._out.finish(forwarded)
                return
            if not isinstance(item, Failure):
                try:
                    item = await device.move(item)
                except Exception as exc:
                    item = Failure.capture(exc, "device", seq, self._inflight.get(seq, ()))
            self._out.put(seq, item)
            forwarded += 1
