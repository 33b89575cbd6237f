"""The seam between an epoch and whatever runs its batches: an :class:`Engine`.

An epoch submits batches to an engine and awaits their results; it does not know whether they
run in asyncloader's own worker processes (:class:`asyncloader._engines.local_pool.ProcessPool`),
in a
user's ``concurrent.futures.Executor`` or in a loader thread (:class:`ExecutorEngine`).
Workers that fetch and iterate an iterable source themselves (``fetch_in_workers``: the local
:class:`asyncloader._engines.fetching_workers.WorkerGroup`, Ray actors of :mod:`asyncloader.ray`)
are a
:class:`WorkerEngine`: the same members, and the batches of each worker's own iteration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Protocol

from asyncloader._base import Samples, Seeds, outside_the_loop
from asyncloader._worker import BatchPlan, run_batch


class Engine(Protocol):
    """Runs :func:`asyncloader._worker.plan.run_batch` for the batches of an epoch."""

    def start(self) -> None:
        """Makes the engine ready for work (blocking: called off the event loop)."""

    def submit(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Future[Any]:
        """Starts batch ``seq``; the future resolves to the batch (or its Failure).

        Raises:
            concurrent.futures.process.BrokenProcessPool: A worker died (from here or from the
                future).
        """

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        """After a crash: which worker died, how, and the batch it held (blocking); ``""`` when
        the engine cannot tell more than the exception's own message."""

    def shutdown(self) -> None:
        """Stops the engine and joins what it started. Idempotent; blocking."""


class WorkerEngine(Engine, Protocol):
    """An engine of ``num_workers`` addressable workers that fetch, and iterate an iterable
    source each (see :mod:`asyncloader._pipeline.worker_streams`)."""

    num_workers: int

    def new_token(self) -> int:
        """A token naming one epoch's iteration, new each time."""

    def next_stream(self, worker: int, opening: Any, number: int) -> Future[Any]:
        """Batch ``number`` of ``worker``'s own iteration of the epoch ``opening``
        (a :class:`~asyncloader._worker.protocol.StreamOpen`) starts: see
        :meth:`asyncloader._worker.loop.WorkerCore.next_stream`."""

    def open_stream(self, worker: int, opening: Any) -> Future[Any]:
        """Opens ``worker``'s iteration of the epoch ``opening`` starts; resolves to the
        source's own state right after: see
        :meth:`asyncloader._worker.loop.WorkerCore.open_stream`."""


class ExecutorEngine:
    """An ``Executor`` the loader does not own the workers of: the plan travels with each task.

    Args:
        executor: A user's executor (never shut down here), or a loader thread pool (shut down
            with the epoch when ``owned``).
        plan: What to do to each batch.
        owned: :meth:`shutdown` shuts the executor down.
    """

    def __init__(self, executor: Executor, plan: BatchPlan, owned: bool = False) -> None:
        self.executor = executor
        self.plan = plan
        self._owned = owned

    def start(self) -> None:
        pass

    def submit(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Future[Any]:
        return self.executor.submit(run_batch, self.plan, seq, indices, samples, seeds)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        return ""  # the executor's own message says it best

    def shutdown(self) -> None:
        if self._owned:
            self.executor.shutdown(wait=True, cancel_futures=True)


class LoopEngine:
    """Makes each batch right where it is submitted: on the loader's own event-loop thread.

    For a ``for`` epoch without workers whose batches are whole ``__getitems__`` calls made one
    at a time (``fetch_threads=1``): that loop has nothing else to run while a batch is made,
    so a fetch thread beside it would only add a thread, and a hand-over of the GIL at every
    batch, to the two DataLoader needs (the batch's maker and the consumer). The returned
    future is already done; the loop is blocked for the duration of each call, which runs
    as if no loop ran there (the dataset may call ``asyncio.run()``, as in a plain thread).
    """

    def __init__(self, plan: BatchPlan) -> None:
        self.plan = plan

    def start(self) -> None:
        pass

    def submit(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(outside_the_loop(run_batch, self.plan, seq, indices, samples, seeds))
        except Exception as exc:  # as an executor would hand it over
            future.set_exception(exc)
        return future

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        return ""

    def shutdown(self) -> None:
        pass
