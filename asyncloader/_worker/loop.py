"""A worker that fetches: its own event loop, many batches at once (``fetch_in_workers=True``).

:class:`WorkerCore` is the work of one worker whatever carries its messages: the local
engine's pipe (:func:`serve`, the main function of each worker process of
:class:`asyncloader._engines.fetching_workers.WorkerGroup`) or a Ray actor
(:mod:`asyncloader.ray`). On the
worker's event loop (uvloop when installed) a :class:`~asyncloader._worker.fetch.Fetcher` fetches
the samples of every batch the worker holds, at most ``io_limit`` at once; CPU work (a sync
``__getitem__``, ``transform``, ``collate_fn``, the move into shared memory) runs on one
compute thread, so the loop goes on fetching meanwhile.

An iterable source's copy in the worker is iterated here too, as under DataLoader:
:meth:`WorkerCore.next_stream` makes the next batch of the worker's own iteration, one at a
time and in order; the first call of an epoch opens the iteration (seeding the worker's RNGs
and restoring the source's saved state, or replaying the batches already delivered).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from asyncloader._base import (
    Failure,
    Samples,
    Seeds,
    SourceKind,
    call_seeded,
    get_worker_info,
    loader_threads,
    new_event_loop,
    open_iterator,
    restore_dataset,
    seed_stream,
    source_state,
    sync_stream,
    take_async,
    take_sync,
    tracing,
)
from asyncloader._tuning import FetchTuner
from asyncloader._worker.fetch import Fetcher, fetch_then_run
from asyncloader._worker.getitems import BatchFetcher
from asyncloader._worker.plan import BatchPlan, run_batch
from asyncloader._worker.process_state import init_failure
from asyncloader._worker.protocol import (
    LOST,
    STOP,
    SUPERSEDED,
    Ended,
    Keyed,
    NextOfStream,
    Ready,
    Request,
    RunBatch,
    Signal,
    StreamOpen,
    WorkerConfig,
    WorkerSpec,
    answer_bytes,
    batch_of,
)
from asyncloader._worker.startup import setup_worker


class _Stream:
    __slots__ = (
        "ended", "failed", "iterator", "next", "opened", "opening", "pull", "superseded", "turn"
    )  # fmt: skip

    def __init__(self, opening: StreamOpen) -> None:
        self.opening: StreamOpen | None = opening  # until the iteration is opened
        self.opened: Any = None  # the source's own state right after opening
        self.failed: Failure | None = None  # opening failed: the first batch request says so
        self.iterator: Any = None
        self.pull: Any = None  # what a sync iteration's items are taken from (sync_stream)
        self.ended: Ended | None = None
        self.superseded = False
        self.next = opening.delivered  # the number of the next batch to make
        self.turn = asyncio.Condition()  # requests are served by number, whatever their order


class WorkerCore:
    """The batches of one worker, on the running event loop (see the module docstring).

    Args:
        plan: The loader's plan, holding the dataset.
        config: The loader's worker configuration.
        worker_id: This worker's id.
        restarted: This worker replaces one that died (a Ray actor restarted by Ray): an
            iteration it is asked to continue rather than begin was lost with its predecessor.
    """

    def __init__(
        self, plan: BatchPlan, config: WorkerConfig, worker_id: int, restarted: bool = False
    ) -> None:
        self._restarted = restarted
        self._plan = plan
        self._config = config
        self._id = worker_id
        self._loop = asyncio.get_running_loop()
        self._compute = loader_threads(1, "asyncloader-compute")
        self._fetch_pool = None
        self._sample_seed: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        get = None
        if config.kind is SourceKind.ASYNC_MAP:
            get = plan.dataset.__getitem__
        elif config.kind is SourceKind.MAP and config.fetch_threads > 1:
            self._fetch_pool = loader_threads(config.fetch_threads, "asyncloader-fetch")
            get = self._get_in_thread
        # Without a fetcher a sync __getitem__ (or __getitems__) runs on the compute thread,
        # one batch at a time (DataLoader's way, and the batch's seeding covers it).
        tuner = None
        if config.io_budget is not None:  # the tuner lives as long as the worker: across epochs
            tuner = FetchTuner(max(1, config.io_limit), config.io_budget, time.perf_counter())
        self._fetcher: Fetcher | BatchFetcher | None = None
        if plan.getitems and self._fetch_pool is not None:  # a call per batch, in those threads
            aligned = plan.transform is not None
            self._fetcher = BatchFetcher(
                plan.dataset, self._fetch_pool, config.fetch_threads, plan.skip, aligned
            )
        elif get is not None:
            self._fetcher = Fetcher(
                get, max(1, config.io_limit), self.spawn, plan.skip, tuner=tuner
            )
        self._run_plan = dataclasses.replace(plan, dataset=None) if self._fetcher else plan
        self._streams: dict[int, _Stream] = {}  # the newest epoch's iteration only
        self._newest = -1  # its token (tokens grow epoch by epoch)

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _get_in_thread(self, index: Any) -> asyncio.Future[Any]:
        getitem = self._plan.dataset.__getitem__
        return self._loop.run_in_executor(
            self._fetch_pool, call_seeded, self._sample_seed, index, getitem, index
        )

    def _runner(self, plan: BatchPlan, seeds: Seeds | None) -> Any:
        def run(seq: int, indices: Sequence[Any], samples: Samples | None) -> Any:
            return self._loop.run_in_executor(
                self._compute, run_batch, plan, seq, indices, samples, seeds
            )

        return run

    def run(self, request: Request) -> Coroutine[Any, Any, Any]:
        """The coroutine that answers ``request``."""
        if isinstance(request, RunBatch):
            return self.batch(request.seq, request.indices, request.samples, request.seeds)
        if isinstance(request, NextOfStream):
            return self.next_stream(request.opening, request.number)
        return self.open_stream(request.opening)

    async def batch(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Any:
        """Batch ``seq`` of a map-style source (or of samples given): fetched, transformed,
        collated and ready to leave the process; or its Failure."""
        if (failed := init_failure()) is not None:
            return failed
        self._sample_seed = seeds.sample_seeds if seeds is not None else None
        run = self._runner(self._run_plan, seeds)
        return await fetch_then_run(self._fetcher, run, seq, indices, samples)

    async def next_stream(self, opening: StreamOpen, number: int) -> Any:
        """Batch ``number`` of this worker's iteration of epoch ``opening.token`` (opened by
        its first request; an older epoch's is dropped then): ``(indices, batch, state)``,
        where ``state`` is the source's own state after it (``None`` when it keeps none), or
        :class:`Ended`, or :data:`LOST` when this worker cannot make that batch (restarted since
        its iteration began). ``indices`` are offsets in the worker's own stream. Requests are
        served in the order of their numbers, whatever order they arrive in (a Ray actor may
        start them out of order).

        Liveness: while request ``number`` waits, the request for ``stream.next`` has
        arrived or will (the epoch asks numbers in order, each once) and, whatever it returns
        or raises, its ``finally`` advances ``next`` and wakes every waiter; a superseded
        iteration's waiters are woken to answer SUPERSEDED (:meth:`_supersede`)."""
        stream = self._stream(opening, number)
        if not isinstance(stream, _Stream):
            return stream
        async with stream.turn:
            if number < stream.next:
                return LOST
            await stream.turn.wait_for(lambda: stream.next == number or stream.superseded)
            if stream.superseded:
                return SUPERSEDED
            try:
                return await self._next(stream, number)
            finally:
                stream.next += 1
                stream.turn.notify_all()

    async def open_stream(self, opening: StreamOpen) -> Any:
        """Opens this worker's iteration of epoch ``opening.token`` unless a batch request did
        already, and answers the source's own state right after opening (``None`` when it
        keeps none, or when opening failed: the first batch request raises that), or
        :data:`SUPERSEDED` / :data:`LOST` as :meth:`next_stream` would."""
        stream = self._stream(opening, opening.delivered)
        if not isinstance(stream, _Stream):
            return stream
        async with stream.turn:
            if init_failure() is None:
                await self._opened(stream)
            return stream.opened

    def _stream(self, opening: StreamOpen, number: int) -> _Stream | str:
        """The iteration ``opening`` names (created by its first request; an older epoch's is
        dropped then), or what to answer instead."""
        if opening.token < self._newest:
            return SUPERSEDED
        stream = self._streams.get(opening.token)
        if stream is None:
            if self._restarted and number != opening.delivered:
                return LOST
            stream = _Stream(opening)
            for old in self._streams.values():
                self._supersede(old)
            self._streams, self._newest = {opening.token: stream}, opening.token
        return stream

    def _supersede(self, stream: _Stream) -> None:
        """Wakes an older iteration's waiting requests to answer SUPERSEDED."""
        stream.superseded = True

        async def wake() -> None:
            async with stream.turn:
                stream.turn.notify_all()

        self.spawn(wake(), name="supersede")

    async def _next(self, stream: _Stream, number: int) -> Any:
        if (failed := init_failure()) is not None:
            return None, failed, None
        await self._opened(stream)
        if stream.failed is not None:
            failure, stream.failed = stream.failed, None
            return range(0), failure, None
        return await self._pull(stream, number)

    async def _opened(self, stream: _Stream) -> None:
        """Opens ``stream`` once, under its turn: seeds, restores the saved state or replays
        the batches already delivered, and keeps the source's own state then."""
        if stream.opening is None:
            return
        opening, stream.opening = stream.opening, None
        try:
            stream.iterator = await self._open(opening)
            stream.pull = sync_stream(self._plan.dataset, stream.iterator)
        except Exception as exc:
            stream.ended = Ended(None)
            stream.failed = self._stream_failure(exc, "fetch", opening.delivered, range(0))
            return
        for replayed in range(opening.delivered if opening.state is None else 0):
            if isinstance(await self._pull(stream, replayed), Ended):
                break
        stream.opened = source_state(self._plan.dataset, stream.iterator)

    async def _open(self, opening: StreamOpen) -> Any:
        seed_stream(opening.seed)
        dataset, saved = self._plan.dataset, opening.state or {}

        def start() -> Any:
            set_epoch = getattr(dataset, "set_epoch", None)
            tell = None
            if opening.epoch is not None and callable(set_epoch):
                tell = functools.partial(set_epoch, opening.epoch)
            restore_dataset(dataset, saved, tell, bool(opening.delivered) or opening.resumed)
            return open_iterator(dataset, saved, self._is_async)

        if self._is_async:
            return start()
        return await self._loop.run_in_executor(self._compute, start)

    @property
    def _is_async(self) -> bool:
        return self._config.kind is SourceKind.ASYNC_ITERABLE

    async def _pull(self, stream: _Stream, number: int) -> Any:
        if stream.ended is not None:
            return stream.ended
        config, dataset, iterator = self._config, self._plan.dataset, stream.iterator
        size = config.batch_size or 1
        offsets = range(number * size, (number + 1) * size)
        try:
            if self._is_async:
                samples = await take_async(iterator, size)
                state = source_state(dataset, iterator)
            else:
                samples, state = await self._loop.run_in_executor(
                    self._compute, take_sync, dataset, iterator, stream.pull, size
                )
        except Exception as exc:
            return offsets, self._stream_failure(exc, "fetch", number, offsets), None
        if not samples or (config.drop_last and len(samples) < size):
            stream.ended = Ended(state)
            return stream.ended
        offsets = offsets[: len(samples)]
        info = get_worker_info()
        if info is not None:
            tracing.stream_flows(info.id, info.num_workers)
        result = await self._runner(self._run_plan, None)(number, offsets, samples)
        if isinstance(result, Failure):
            result.exc.add_note(f"asyncloader: worker={self._id} (batch {number} of its stream)")
        return offsets, result, state

    def _stream_failure(
        self, exc: Exception, stage: str, number: int, offsets: Sequence[Any]
    ) -> Failure:
        failure = Failure.capture(exc, stage, number, offsets)
        exc.add_note(f"asyncloader: worker={self._id} (batch {number} of its stream)")
        return failure

    async def aclose(self) -> None:
        """Cancels what is in flight and stops the threads (without waiting for user code)."""
        if self._fetcher is not None:
            self._fetcher.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in self._streams.values():
            if stream.iterator is not None and hasattr(stream.iterator, "aclose"):
                with contextlib.suppress(Exception):
                    await stream.iterator.aclose()
        self._compute.shutdown(wait=False, cancel_futures=True)
        if self._fetch_pool is not None:
            self._fetch_pool.shutdown(wait=False, cancel_futures=True)


# -- the local engine's worker process ------------------------------------------------------


def serve(conn: Any, owner_pid: int, spec: WorkerSpec) -> None:
    """Main function of a :class:`~asyncloader._engines.fetching_workers.WorkerGroup` worker
    process: sets the
    process up as worker ``spec.worker_id``, then :func:`serve_on` ``conn``."""
    setup_worker(
        owner_pid, spec.worker_id, spec.num_workers, spec.base_seed, spec.plan, spec.worker_init_fn
    )
    serve_on(conn, spec.plan, spec.config, spec.worker_id)


def serve_on(
    conn: Any, plan: BatchPlan, config: WorkerConfig, worker_id: int, role: str = "worker"
) -> None:
    """Answers the requests that come over ``conn`` until told to stop, on an event loop of
    its own, in a process set up as a worker already (by :func:`serve`; or a Ray actor of this
    machine, on a thread of its own: :mod:`asyncloader._engines.ray.sockets`).

    The messages are :mod:`asyncloader._worker.protocol`'s: :class:`Ready` once, then a
    one answer (:func:`~asyncloader._worker.protocol.answer_bytes`) for each :class:`Keyed`
    request, until :data:`STOP`.
    A closed connection is a stop. A trace names the process ``f"{role} {worker_id}"``.
    """
    conn.send(Ready(init_failure()))
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(conn, plan, config, worker_id, role))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _serve(
    conn: Any, plan: BatchPlan, config: WorkerConfig, worker_id: int, role: str
) -> None:
    """Liveness: each request read gets exactly one answer unless STOP comes first (then
    nobody waits for it): ``answer`` catches what asyncloader's own code raises, and a result
    that does not pickle is answered by its Failure. A closed connection reads as STOP."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Keyed | Signal] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = STOP
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is STOP:
                return

    threading.Thread(target=read, name="asyncloader-inbox", daemon=True).start()
    core = WorkerCore(plan, config, worker_id)

    def reply(key: int, request: Request, result: Any) -> None:
        try:
            payload = answer_bytes(key, tracing.with_events(result))
        except Exception as exc:  # the result does not pickle: say so in its place
            indices = result[0] if type(result) is tuple else getattr(request, "indices", ())
            seq = batch_of(request)
            failure = Failure.capture(exc, "send", -1 if seq is None else seq, indices)
            payload = answer_bytes(key, failure)
        with contextlib.suppress(OSError):  # the training process stopped listening
            conn.send_bytes(payload)

    async def answer(key: int, request: Request) -> None:
        try:
            result = await core.run(request)
        except Exception as exc:  # asyncloader's own bug: still answer, never hang
            result = _failed(request, exc)
        reply(key, request, result)

    try:
        while (message := await inbox.get()) is not STOP:
            assert isinstance(message, Keyed)
            tracing.worker_recording(message.trace, lambda: f"{role} {worker_id}")
            request = message.request
            core.spawn(
                answer(message.key, request), name=f"{type(request).__name__}:{batch_of(request)}"
            )
    finally:
        await core.aclose()


def _failed(request: Request, exc: Exception) -> Any:
    """What a request answers when asyncloader's own code raised while making it: the
    batch's Failure; for an opening None (the batch requests that follow report it)."""
    if isinstance(request, RunBatch):
        return Failure.capture(exc, "worker", request.seq, request.indices)
    if isinstance(request, NextOfStream):
        return (range(0), Failure.capture(exc, "worker", request.number, range(0)), None)
    return None
