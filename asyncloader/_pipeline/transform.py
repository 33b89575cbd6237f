"""Executor offload with a bounded in-flight window.

One task per batch runs :func:`asyncloader._worker.plan.run_batch` on the epoch's engine (fetch when
the engine holds the dataset, then transform and collate). At most ``window`` batches are in
the engine at once, ``window`` the largest size the room ever had (``prefetch="auto"`` resizes
it; see :class:`~asyncloader._base.window.Window`).

When the plan holds only torch's default collate (no dataset, no transform, no per-sample
seeding), a batch smaller than :data:`INLINE_COLLATE_BYTES` may be collated right on the event
loop instead: a copy of a few KiB costs less than the two thread hops (and the GIL hand-offs)
of a trip through the executor. There, :func:`collate_small` stacks numeric numpy samples in
one numpy call instead of a tensor per sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from torch.utils.data import default_collate, default_convert

from asyncloader._base import Samples, Seeds, Trimmed, Window, nbytes, run_in_thread, tracing
from asyncloader._engines import Engine, LoopEngine, worker_of
from asyncloader._tuning import EpochMeter, now
from asyncloader._worker import BatchPlan, Pooled, Returns, collate_small, from_shared, run_batch
from asyncloader.errors import AsyncLoaderError, WorkerCrashedError

#: Batches below this size that need only the default collate may be collated on the loop: a
#: copy of at most this much takes microseconds, less than the thread hops it saves, and is
#: too small to be worth torch's intra-op thread pool.
INLINE_COLLATE_BYTES = 64 * 1024


def inline_plan(plan: BatchPlan, seeds: Seeds) -> BatchPlan | None:
    """The plan to run on the loop for small batches, or None: collate must be all there is to
    do (no dataset, no transform, no per-sample seeding, torch's default collate)."""
    if (
        plan.dataset is not None
        or plan.transform is not None
        or plan.collate not in (default_collate, default_convert)
        or seeds.per_sample
    ):
        return None
    if plan.collate is default_collate:
        return dataclasses.replace(plan, collate=collate_small)
    return plan


class Transformer:
    """Submits batches to ``engine``, at most ``window`` at once.

    Liveness: while a batch waits for room and fewer than ``window`` are in the engine, a
    permit is free (:class:`~asyncloader._base.window.Window`); each batch in the engine gives
    its permit back on every exit (``async with``), and its engine future completes (answer,
    ``BrokenProcessPool``) or, cancelled by the engine, fails the epoch (:func:`_answer`).

    Args:
        engine: Where batches are processed.
        window: Batches at most in the engine (:meth:`resize` moves it).
        seeds: How batches seed the global RNGs (:class:`~asyncloader._base.seeding.Seeds`).
        inflight: seq -> indices of the batches not yet handed to the consumer (for crash
            reports).
        inline: A plan (from :func:`inline_plan`) under which small batches are collated on
            the loop: only for an engine of the loader's own threads, which the loop would
            otherwise wait on.
        meter: Told each batch's round trip and the batches in the engine.
    """

    __slots__ = ("_inflight", "_inline", "_meter", "_returns", "_room", "_seeds", "_turn", "engine")

    def __init__(
        self,
        engine: Engine,
        window: int,
        seeds: Seeds | None,
        inflight: Mapping[int, Sequence[Any]],
        inline: BatchPlan | None = None,
        meter: EpochMeter | None = None,
    ) -> None:
        self.engine = engine
        self._meter = meter
        self._room = Window(window)
        self._seeds = seeds
        self._inflight = inflight
        self._inline = inline
        self._returns = Returns()
        # A LoopEngine makes batches right here: one at a time, each after the loop's turn.
        self._turn = asyncio.Lock() if isinstance(engine, LoopEngine) else None

    @property
    def room(self) -> Window:
        """The engine's room: ``room.ahead`` batches in the engine now, of ``room.size``."""
        return self._room

    def resize(self, window: int) -> None:
        """Batches at most in the engine from now on (a smaller room is reached as batches
        leave it)."""
        self._room.resize(window)

    async def run(self, seq: int, indices: Sequence[Any], samples: Samples | None) -> Any:
        """Returns batch ``seq`` (or its Failure, or under ``on_error="skip"`` a Trimmed).

        Raises:
            WorkerCrashedError: A worker process died while the engine held this batch.
        """
        inline = self._inline  # a block of rows (RowBlock) goes to the engine
        if (
            inline
            and type(samples) is list
            and samples
            and nbytes(samples[0]) * len(samples) < INLINE_COLLATE_BYTES
        ):
            return run_batch(inline, seq, indices, samples, None)
        if self._turn is not None:
            return await self._run_here(seq, indices, samples)
        async with self._room:
            meter = self._meter
            began = now() if meter is not None else 0.0
            tracing.begin("engine", "batch", seq)
            try:  # submit() itself raises once the pool is broken
                future = self.engine.submit(seq, indices, samples, self._seeds)
                self.made_by(seq, worker_of(future))
                return self.received(await _answer(future, seq))
            except BrokenProcessPool as exc:
                tracing.instant("worker crashed", "failure", {"batch": seq, "error": str(exc)})
                raise await self.crashed(exc) from exc
            finally:
                tracing.end("engine", "batch", seq)
                if meter is not None:
                    meter.engine.add(now() - began)

    async def _run_here(self, seq: int, indices: Sequence[Any], samples: Samples | None) -> Any:
        """Batch ``seq`` made on this loop (a :class:`LoopEngine`). Each batch first lets the
        loop run what is ready, the hand-over of the batch before it among them: otherwise
        the batches the window admitted would all be made before the first reached the
        consumer."""
        assert self._turn is not None
        async with self._turn:
            await asyncio.sleep(0)
            meter = self._meter
            began = now() if meter is not None else 0.0
            try:
                future = self.engine.submit(seq, indices, samples, self._seeds)
                return self.received(future.result())
            finally:
                if meter is not None:
                    meter.engine.add(now() - began)

    def made_by(self, seq: int, worker: int | None) -> None:
        """Batch ``seq`` is made by ``worker``: the consumer's wait for it counts as its."""
        if self._meter is not None:
            self._meter.made_by(seq, worker)

    def received(self, result: Any) -> Any:
        """A batch as the engine returned it, unpacked in this process."""
        result = tracing.absorb(result)
        if type(result) is Trimmed:  # on_error="skip" left samples out
            result.batch = self._unpacked(result.batch)
            return result
        return self._unpacked(result)

    def _unpacked(self, result: Any) -> Any:
        if type(result) is Pooled:  # in a worker's reused segments
            result = self._returns.received(result)
        return from_shared(result)

    def sweep(self) -> None:
        """Tells the workers which of their reused segments the consumer has let go; from any
        thread (see :class:`~asyncloader._worker.buffers.Returns`)."""
        self._returns.sweep()

    def close(self) -> None:
        """The epoch is over: its workers' reused segments are let go (see
        :class:`~asyncloader._worker.buffers.Returns`)."""
        self._returns.close()

    async def crashed(self, exc: BaseException) -> WorkerCrashedError:
        """The error for a worker that died: which, how, and the batches it held."""
        engine, inflight = self.engine, self._inflight
        details = await run_in_thread(lambda: engine.describe_crash(inflight), "asyncloader-crash")
        return WorkerCrashedError(
            f"{details or exc}. The pool is discarded: iterate the loader again for a fresh one."
        )


async def _answer(future: Future[Any], seq: int) -> Any:
    """The engine's answer for batch ``seq``.

    Liveness: an admitted batch always ends in the reorder buffer or fails the epoch. A
    future the engine cancelled itself (its pool or executor shut down under the running
    epoch) raises here: let out as ``CancelledError`` it would end the batch's task as if the
    epoch were closing, which the TaskGroup drops silently, and the batch's turn (and its
    window permit) would never come.

    Raises:
        AsyncLoaderError: The engine cancelled the batch while this task was not cancelled.
    """
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not future.cancelled() or task is None or task.cancelling():
            raise  # the epoch is closing: this task was cancelled, not the batch
        raise AsyncLoaderError(
            f"batch {seq} was cancelled by its engine before it ran: its worker pool or "
            "executor was shut down while the epoch was running"
        ) from None
