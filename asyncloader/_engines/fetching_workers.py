"""asyncloader's workers that fetch: processes with an event loop each, many batches in flight.

The local :class:`~asyncloader._engines.engine.Engine` of ``fetch_in_workers=True``. Each worker
runs
:func:`asyncloader._worker.loop.serve` and talks to the training process over a pipe of its
own, so one worker holds as many batches at once as its share of ``io_concurrency`` keeps
busy (a ``ProcessPoolExecutor`` gives each worker one task at a time), and a request can go
to a chosen worker (an iterable source's batches come from each worker's own iteration).

Requests and answers travel as :class:`~asyncloader._engines.channels.Channels` sends them: a batch
goes to the worker holding the fewest, and one receiver thread waits on every pipe and every
process sentinel; when a worker dies every request still pending fails, and the epoch raises
:class:`~asyncloader.errors.WorkerCrashedError` naming the worker, how it died (DataLoader's
words, the signal's name) and the batches it held.

Start-up and shutdown are blocking and run off the event loop, with
:class:`~asyncloader._engines.local_pool.ProcessPool`'s rules: stop, grace, terminate, kill, join.
"""

from __future__ import annotations

import os
import weakref
from contextlib import AbstractContextManager, nullcontext
from multiprocessing.connection import wait
from typing import Any

from asyncloader._base import before_exit
from asyncloader._config import Options
from asyncloader._engines.channels import Channels
from asyncloader._engines.local_pool import (
    EXIT_GRACE_S,
    SHUTDOWN_GRACE_S,
    death_note,
    stop_processes,
)
from asyncloader._engines.start_method import check_start, default_mp_context
from asyncloader._worker import BatchPlan, WorkerConfig, WorkerSpec, serve
from asyncloader.errors import WorkerCrashedError

_live: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()


def _shut_down_live() -> None:
    for group in list(_live):
        group.shutdown(EXIT_GRACE_S)


def worker_config(options: Options, share: int) -> WorkerConfig:
    """The worker configuration of a loader whose workers each fetch ``share`` samples at
    once (at most, under ``io_concurrency="auto"``, with their share of the budget)."""
    budget = None
    if options.auto_io and options.memory_budget is not None:
        budget = max(1, options.memory_budget * share // max(1, options.io_cap))
    return WorkerConfig(
        kind=options.kind,
        io_limit=share,
        fetch_threads=options.fetch_threads,
        batch_size=options.batch_size,
        drop_last=options.drop_last,
        loader_name=options.loader_name,
        io_budget=budget,
    )


def worker_specs(options: Options, plan: BatchPlan, base_seed: int, n: int) -> list[WorkerSpec]:
    """What each of ``n`` fetching workers starts with: ``io_concurrency`` split among them
    (the first get one more)."""
    total = options.io_cap
    return [
        WorkerSpec(
            i,
            n,
            base_seed,
            plan,
            options.worker_init_fn,
            worker_config(options, total // n + (i < total % n)),
        )
        for i in range(n)
    ]


class WorkerGroup(Channels):
    """``num_workers`` fetching worker processes (see the module docstring).

    Args:
        options: The loader's options.
        plan: Sent to each worker once, at start (it holds the dataset).
        base_seed: Worker ``i`` seeds its RNGs with ``base_seed + i``.
        ctx: The multiprocessing context; default ``options.mp_context`` or
            :func:`default_mp_context`.
    """

    def __init__(self, options: Options, plan: BatchPlan, base_seed: int, ctx: Any = None) -> None:
        ctx = ctx or options.mp_context or default_mp_context()
        check_start(ctx, plan.sent(options.worker_init_fn))
        super().__init__(options.num_workers, options.loader_name)
        self._specs = worker_specs(options, plan, base_seed, self.num_workers)
        self._ctx = ctx
        self._procs: list[Any] = []
        self._init_failures: list[Any] | None = None  # once started: per worker, or None
        _live.add(self)
        before_exit(_shut_down_live)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, launching: AbstractContextManager[Any] | None = None) -> None:
        """Starts every worker and waits until each has run its ``worker_init_fn`` (blocking).
        Once started (persistent workers, a later epoch), raises what it raised then.

        Args:
            launching: Entered around the process starts alone, not the wait for their
                ``worker_init_fn`` (see :func:`asyncloader._base.threads.loops_parked`).

        Raises:
            Exception: The user's own exception, when a ``worker_init_fn`` raised.
            WorkerCrashedError: A worker died while starting.
        """
        if self._init_failures is None:
            self.launch(launching)
            self._init_failures = [self._ready(i) for i in range(self.num_workers)]
            self._listen()
        for failure in self._init_failures:
            if failure is not None:
                failure.reraise()

    def launch(self, launching: AbstractContextManager[Any] | None = None) -> None:
        """Starts every worker process now, without waiting for their ``worker_init_fn``
        (:meth:`start` waits). Once.

        Args:
            launching: Entered around the process starts alone (see
                :func:`asyncloader._base.threads.loops_parked`).
        """
        if not self._procs:
            with launching or nullcontext():
                self._launch()

    def _launch(self) -> None:
        for spec in self._specs:
            theirs, ours = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(
                target=serve,
                args=(ours, os.getpid(), spec),
                daemon=True,
                name=f"asyncloader-worker-{spec.worker_id}",
            )
            proc.start()
            ours.close()
            self._procs.append(proc)
            self._conns.append(theirs)

    def _ready(self, i: int) -> Any:
        conn, proc = self._conns[i], self._procs[i]
        if wait([conn, proc.sentinel]) and conn.poll():
            try:
                return conn.recv().init_failure  # protocol.Ready
            except (EOFError, OSError):
                pass
        proc.join(SHUTDOWN_GRACE_S)
        with self._lock:  # broken: a persistent group is replaced, not started again
            self._dead[i] = (proc.exitcode, [])
        raise WorkerCrashedError(
            f"{self._loader_name} worker {i} died while starting (exit code {proc.exitcode}: "
            "the dataset, transform or collate_fn could not be unpickled, or it was killed; see "
            "its log above)"
        )

    @property
    def processes(self) -> list[Any]:
        """The worker processes, once started."""
        return list(self._procs)

    def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stops every worker and joins them and the receiver. Idempotent; blocking."""
        if not self._stop_requests():
            return
        stop_processes(self._procs, grace)
        self._join_receiver()
        for conn in self._conns:
            conn.close()
        # The Process objects stay open: an iterator's _workers may still join them and read
        # their exit codes (they release their sentinels when collected).

    # -- how a worker died ---------------------------------------------------------------------

    def _sentinel(self, i: int) -> Any:
        return self._procs[i].sentinel

    def _how_died(self, i: int) -> Any:
        proc = self._procs[i]
        proc.join()
        return proc.exitcode

    def _death_note(self, i: int, how: Any, held: str) -> str:
        return death_note(self._loader_name, self._procs[i].pid, how, held)
