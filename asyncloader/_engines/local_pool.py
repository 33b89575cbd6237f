"""asyncloader's own worker processes: a ProcessPoolExecutor whose workers get the plan once.

The local :class:`~asyncloader._engines.engine.Engine`: a batch task carries only ``(seq, indices)``
or the samples fetched on the loop, the plan having reached each worker through the
initializer.

Start-up and shutdown are blocking and run off the event loop (see ``_threads.run_in_thread``).
Shutdown follows DataLoader's: workers are asked to exit after their current task, given a
grace period, then terminated, then killed; every process and the pool's own threads are
joined before :meth:`ProcessPool.shutdown` returns.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from asyncloader._base import (
    Samples,
    Seeds,
    before_exit,
    pool_is_broken,
    pool_manager_thread,
    pool_processes,
    tracing,
)
from asyncloader._config import Options
from asyncloader._engines.start_method import check_start, default_mp_context
from asyncloader._worker import (
    BatchPlan,
    Running,
    init_failure,
    init_worker,
    run_batch_traced,
)
from asyncloader.errors import WorkerCrashedError

SHUTDOWN_GRACE_S = 5.0
#: At interpreter exit, workers get this long to finish their batch before they are terminated.
EXIT_GRACE_S = 0.5

_live: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


def _shut_down_live() -> None:
    """At exit: stop every pool of this process still running, quickly."""
    for pool in list(_live):
        pool.shutdown(EXIT_GRACE_S)


def stop_processes(processes: list[Any], grace: float) -> None:
    """Joins ``processes`` (asked to exit already) for ``grace`` seconds in all, then
    terminates, then kills and joins those still alive: DataLoader's order."""
    deadline = time.monotonic() + grace
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


def death_note(loader_name: str, pid: int | None, code: int | None, held: str) -> str:
    """How a worker died, worded as DataLoader's, with the signal's name and what it held."""
    if code is not None and code < 0:
        how = f"is killed by signal: {signal.strsignal(-code)} ({signal.Signals(-code).name})"
    else:
        how = f"exited unexpectedly with exit code {code}"
    hint = ""
    if code == -signal.SIGBUS:
        hint = " (SIGBUS in a worker usually means /dev/shm is full: make it larger)"
    return f"{loader_name} worker (pid {pid}) {how} while running {held}{hint}"


class ProcessPool:
    """``num_workers`` processes, each holding the batch plan, started eagerly.

    Args:
        options: The loader's options (num_workers, mp_context, worker_init_fn).
        plan: Sent to each worker once, at start.
        base_seed: Worker ``i`` seeds its RNGs with ``base_seed + i``.
        ctx: The multiprocessing context; default ``options.mp_context`` or
            :func:`default_mp_context`.

    Raises:
        RuntimeError: Starting workers with ``ctx`` would re-run an unguarded main script
            (see :func:`asyncloader._engines.start_method.check_start`).
        TypeError: Workers started with ``ctx`` could not receive the plan.
    """

    def __init__(self, options: Options, plan: BatchPlan, base_seed: int, ctx: Any = None) -> None:
        ctx = ctx or options.mp_context or default_mp_context()
        check_start(ctx, plan.sent(options.worker_init_fn))
        self.num_workers = options.num_workers
        self._loader_name = options.loader_name
        self._counter = ctx.Value("i", 0)
        self._running = Running.allocate(ctx, options.num_workers)
        self.executor = ProcessPoolExecutor(
            max_workers=options.num_workers,
            mp_context=ctx,
            initializer=init_worker,
            initargs=(
                os.getpid(),
                self._counter,
                self._running,
                options.num_workers,
                base_seed,
                plan,
                options.worker_init_fn,
            ),
        )
        self._starting: list[Future[Any]] | None = None  # each worker's start, once launched
        self._closed = False
        self._close_lock = threading.Lock()
        _live.add(self)
        before_exit(_shut_down_live)
        self._processes: dict[int, Any] = {}

    def launch(self, launching: AbstractContextManager[Any] | None = None) -> None:
        """Starts every worker process now, without waiting for their ``worker_init_fn``
        (:meth:`start` waits), so that the epoch's first indices are drawn meanwhile. Once.

        A non-fork executor spawns one process per submit that finds no idle worker, so as many
        submits as workers start them all; a forking one forks them all at the first submit.

        Args:
            launching: Entered around the process starts alone (see
                :func:`asyncloader._base.threads.loops_parked`).
        """
        if self._starting is None:
            with launching or nullcontext():
                self._starting = [
                    self.executor.submit(init_failure) for _ in range(self.num_workers)
                ]

    def start(self, launching: AbstractContextManager[Any] | None = None) -> None:
        """:meth:`launch`, then waits until every worker has run its ``worker_init_fn``
        (blocking), so the first batches do not wait on serial spawns.

        Raises:
            Exception: The user's own exception, when a worker's ``worker_init_fn`` raised
                (with the worker's traceback as its cause).
            WorkerCrashedError: A worker died while starting.
        """
        try:
            self.launch(launching)
            futures = self._starting or []
            failures = [f for f in (future.result() for future in futures) if f is not None]
        except BrokenProcessPool as exc:
            raise WorkerCrashedError(
                "a worker process died while starting (the dataset, transform or collate_fn "
                "could not be unpickled, or it was killed; see its log above)"
            ) from exc
        finally:
            # ProcessPoolExecutor forgets dead processes; keep ours to report exit codes and join.
            self._processes = pool_processes(self.executor)
        if failures:
            failures[0].reraise()

    @property
    def processes(self) -> list[Any]:
        """The worker processes, once started."""
        return list(self._processes.values())

    @property
    def broken(self) -> bool:
        """A worker died; the executor accepts no more work."""
        return pool_is_broken(self.executor)

    def submit(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Future[Any]:
        """Runs batch ``seq`` in a worker, with the plan the worker holds.

        The executor completes the future: the batch, ``BrokenProcessPool`` once a worker
        died, or cancelled by :meth:`shutdown` (``cancel_futures``) when it had not started,
        which the Transformer turns into an error of the epoch still waiting for it."""
        trace = tracing.ACTIVE is not None
        return self.executor.submit(run_batch_traced, trace, seq, indices, samples, seeds)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        """Names the workers that died, how (exit code or signal) and the batch each held.

        Blocking (it waits for the pool to finish breaking): call it off the event loop.

        Args:
            inflight: seq -> indices of the batches not yet handed to the consumer.
        """
        # Read exit codes only once the executor's manager thread has reaped the pool: two
        # threads polling one forkserver sentinel race, and the loser records exit code 255.
        manager = pool_manager_thread(self.executor)
        if manager is not None and manager is not threading.current_thread():
            manager.join(SHUTDOWN_GRACE_S)
        running = self._running.by_pid()
        dead = []
        for pid, proc in self._processes.items():
            code = proc.exitcode
            if code is None or code == 0 or code == -signal.SIGTERM:
                continue  # alive, or terminated by the pool after the crash
            seq = running.get(pid, -1)
            held = (
                f"batch {seq} (indices {list(inflight.get(seq, ()))[:16]})"
                if seq >= 0
                else "no batch"
            )
            dead.append(death_note(self._loader_name, pid, code, held))
        return "; ".join(dead) or "a worker process died (it was already reaped)"

    def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stops every worker and joins them and the pool's threads. Idempotent; blocking."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        executor = self.executor
        # ProcessPoolExecutor drops these references in shutdown(); keep them to join.
        live = pool_processes(executor)
        processes: list[Any] = list({**self._processes, **live}.values())
        manager = pool_manager_thread(executor)
        executor.shutdown(wait=False, cancel_futures=True)
        # The manager thread joins the workers it asked to exit: let it, before this thread
        # joins them too. Two threads polling one forkserver sentinel race, and the loser
        # records exit code 255 for a clean exit (a holder of iterator._workers reads it).
        if manager is threading.current_thread():  # (a finalizer may run this there)
            manager = None
        deadline = time.monotonic() + grace
        if manager is not None:
            manager.join(grace)
        stop_processes(processes, max(0.0, deadline - time.monotonic()))
        if manager is not None:
            manager.join()
        # The counter's lock and the queues held by the Process objects are named semaphores
        # in /dev/shm until collected: drop them now, not when the loader goes.
        self._counter = None
        self._processes = {}
