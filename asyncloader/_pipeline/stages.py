"""Opens the stages of one epoch (:class:`~asyncloader._pipeline.epoch.Epoch`): the fetch on
the loop, the device stage, the engine that transforms and collates, and the numbered batches
from the sampler or the stream; and pumps batches through the device stage.

Each opener enters what it starts (threads, the worker lease, the device thread) into the
epoch's ``AsyncExitStack``, so the epoch's stopping, on every path, is that stack's exit: in
reverse order of opening, after the stage tasks ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch

from asyncloader._base import (
    Failure,
    ReorderBuffer,
    Seeds,
    SourceKind,
    Trimmed,
    call_seeded,
    loader_threads,
    run_in_thread,
)
from asyncloader._checkpoint import Progress
from asyncloader._config import Options
from asyncloader._engines import Engine, ExecutorEngine, LoopEngine, WorkerEngine, WorkerLease
from asyncloader._pipeline.batches import Batch, map_batches, stream_batches
from asyncloader._pipeline.device import DeviceStage
from asyncloader._pipeline.epoch_start import EpochStart, recorded
from asyncloader._pipeline.transform import Transformer, inline_plan
from asyncloader._pipeline.worker_streams import worker_stream_batches
from asyncloader._tuning import EpochMeter, now
from asyncloader._worker import BatchFetcher, BatchPlan

#: How the loop fetches one sample: ``index -> awaitable sample``.
GetSample = Callable[[Any], Awaitable[Any]]


def shut_down_with(stack: contextlib.AsyncExitStack, threads: ThreadPoolExecutor) -> None:
    """Joins ``threads`` when ``stack`` exits, off the loop's thread."""
    stop = lambda: threads.shutdown(wait=True, cancel_futures=True)  # noqa: E731
    stack.push_async_callback(run_in_thread, stop, "asyncloader-reaper")


def fetches_on_loop(options: Options) -> bool:
    """Samples are fetched on this loop one by one (see :func:`open_fetch`)."""
    if options.workers_fetch or options.batch_fetch:
        return False
    return options.kind in (SourceKind.ASYNC_MAP, SourceKind.MAP)


def open_fetch(
    options: Options, stack: contextlib.AsyncExitStack, seeds: Seeds, meter: EpochMeter
) -> tuple[GetSample | None, BatchFetcher | None]:
    """How the loop fetches one sample, or ``None`` where the engine fetches them, or where a
    :class:`BatchFetcher` (returned second) fetches each batch in one ``__getitems__`` call
    (for a user's executor, which transforms and collates them).

    Args:
        options: The epoch's options.
        stack: The epoch's exit stack: the fetch threads are joined when it exits.
        seeds: How the epoch's samples seed the global RNGs.
        meter: The epoch's meter, told each batch a :class:`BatchFetcher` fetches.
    """
    if options.engine_fetches:
        return None, None
    if options.kind is SourceKind.ASYNC_MAP:
        return options.dataset.__getitem__, None
    if options.kind is not SourceKind.MAP:
        return None, None
    threads = loader_threads(options.fetch_concurrency, "asyncloader-fetch")
    shut_down_with(stack, threads)
    if options.batch_fetch:
        skip, aligned = options.on_error == "skip", options.transform is not None
        fetcher = BatchFetcher(
            options.dataset, threads, options.fetch_concurrency, skip, aligned, meter
        )
        return None, fetcher
    loop, seed, getitem = (
        asyncio.get_running_loop(),
        seeds.sample_seeds,
        options.dataset.__getitem__,
    )

    def get(index: Any) -> Awaitable[Any]:
        return loop.run_in_executor(threads, call_seeded, seed, index, getitem, index)

    return get, None


def open_device(options: Options, stack: contextlib.AsyncExitStack) -> DeviceStage | None:
    """The device stage (pinning, the copy to ``device``, ``device_transform``) on its own
    thread, closed when ``stack`` exits; ``None`` where the epoch has none."""
    if not options.device_stage:
        return None
    target = None if options.device is None else torch.device(options.device)
    device = DeviceStage(
        options.pin_memory and torch.cuda.is_available(), target, options.device_transform
    )
    stack.push_async_callback(run_in_thread, device.close, "asyncloader-reaper")
    return device


async def open_transform(
    options: Options,
    stack: contextlib.AsyncExitStack,
    lease: WorkerLease | None,
    own_loop: bool,
    seeds: Seeds,
    window: int,
    inflight: dict[int, Sequence[Any]],
    meter: EpochMeter,
) -> Transformer:
    """The engine of this epoch (worker pool, user executor or a loader thread), behind a
    :class:`Transformer` closed when ``stack`` exits.

    Args:
        options: The epoch's options.
        stack: The epoch's exit stack: the lease is entered into it, the loader's threads
            shut down when it exits.
        lease: The epoch's worker pool, when ``num_workers > 0``.
        own_loop: The epoch runs on the loader's own loop thread (see
            :func:`batches_on_loop`).
        seeds: How the epoch's batches seed the global RNGs.
        window: Batches at most in the engine (``options.engine_window_for(prefetch)``).
        inflight: seq -> indices of the batches not yet handed to the consumer.
        meter: The epoch's meter.
    """
    plan = BatchPlan.of(options)
    inline = None
    engine: Engine
    if lease is not None:
        engine = await stack.enter_async_context(lease)
    elif options.executor is not None:
        engine = ExecutorEngine(options.executor, plan)
    elif batches_on_loop(options, own_loop):
        engine = LoopEngine(plan)
    else:  # the loader's threads; whole batches in the fetch threads (engine_fetches)
        name = "asyncloader-fetch" if options.engine_fetches else "asyncloader-transform"
        threads = loader_threads(options.engine_width, name)
        engine = ExecutorEngine(threads, plan, owned=True)
        stack.push_async_callback(run_in_thread, engine.shutdown, "asyncloader-reaper")
        inline = inline_plan(plan, seeds)
    transformer = Transformer(engine, window, seeds, inflight, inline, meter)
    stack.callback(transformer.close)
    return transformer


def batches_on_loop(options: Options, own_loop: bool) -> bool:
    """Batches are made on the loop itself (:class:`LoopEngine`): whole ``__getitems__``
    batches, one at a time, without workers, on the loader's own loop thread (a ``for``
    epoch, ``own_loop``), which nothing else needs meanwhile. Never on a user's loop
    (``async for``)."""
    return (
        own_loop
        and options.engine_fetches
        and not options.num_workers
        and options.engine_width == 1
    )


def open_batches(
    options: Options,
    stack: contextlib.AsyncExitStack,
    start: EpochStart,
    progress: Progress,
    transformer: Transformer,
) -> AsyncGenerator[Batch, None]:
    """The epoch's numbered batches, ``(seq, indices, samples)``: from the sampler, from an
    iterable source pulled on a loader thread (joined when ``stack`` exits) or on the loop, or
    made by each worker from its own iteration (``worker_streams``)."""
    if options.worker_streams:  # the engine is then a WorkerEngine (Options sees to it)
        engine = cast(WorkerEngine, transformer.engine)
        return worker_stream_batches(
            engine, options, start, progress, transformer.crashed, transformer.made_by
        )
    if options.kind.is_map:
        assert start.index_iter is not None
        indices: Iterator[Any] = start.index_iter
        if progress.tracks_source:  # a dataset that supplies its sampler, stateful
            indices = recorded(indices, options.dataset, progress, start.first_seq)
        return map_batches(options, indices, start.resume)
    thread = None
    if options.kind is SourceKind.ITERABLE:
        thread = loader_threads(1, "asyncloader-source")
        shut_down_with(stack, thread)
    return stream_batches(
        options, start.source_iter, start.claim, start.resume, start.first_seq, progress, thread
    )


async def device_pump(
    device: DeviceStage,
    room: asyncio.Semaphore,
    buffer: ReorderBuffer,
    out: ReorderBuffer,
    inflight: Mapping[int, Sequence[Any]],
    meter: EpochMeter,
) -> None:
    """Moves batches, in order, from the reorder buffer through the device thread.

    Runs at most ``device_depth`` batches ahead of the consumer: room is taken before a
    batch leaves the reorder buffer and returned when the consumer receives it.

    Liveness: while a batch is next in the reorder buffer and fewer than
    ``device_depth`` are between here and the consumer, the pump takes it: ``release()``
    returns the room of each batch received, and every batch taken is forwarded (a
    device error becomes its Failure). The buffer's end finishes the output; its
    failure fails the TaskGroup, and ``Epoch._run`` then fails the output.
    """
    forwarded = 0
    while True:
        await room.acquire()
        try:
            seq, item = await buffer.get()
        except StopAsyncIteration:
            out.finish(forwarded)
            return
        trimmed = item if type(item) is Trimmed else None
        if trimmed is not None:
            item = trimmed.batch
        if not isinstance(item, Failure) and not (trimmed and trimmed.empty):
            began = now()
            try:
                item = await device.move(item)
            except Exception as exc:
                item = Failure.capture(exc, "device", seq, inflight.get(seq, ()))
            meter.device.add(now() - began)
        if trimmed is not None:
            trimmed.batch, item = item, trimmed
        out.put(seq, item)
        forwarded += 1
