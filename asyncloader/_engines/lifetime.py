"""The worker processes' lifetime across a loader's epochs.

Without ``persistent_workers`` every epoch gets a pool of its own, shut down with it; with it,
one pool serves every epoch until the loader closes (and is replaced when a worker died, or
when ``num_workers="auto"`` gives the epoch another count). Each
epoch receives a :class:`WorkerLease`, an async context manager that hands it a started pool
and, on exit, shuts down the pool if the epoch owned it.

Forked workers (the default on Linux before Python 3.14, as DataLoader's) are forked at once,
on the consumer's thread at ``iter()``, with asyncloader's event loops parked
(:mod:`asyncloader._engines.start_method`): in every epoch, for every loader, whatever threads run.
Workers of a start method that pickles start on a helper thread, off the event loop.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from asyncloader._base import finalize_here, heap_frozen, loops_parked, run_in_thread
from asyncloader._config import Options
from asyncloader._engines.fetching_workers import WorkerGroup
from asyncloader._engines.local_pool import ProcessPool
from asyncloader._engines.start_method import default_mp_context, forks, prestart, warm_for_fork
from asyncloader._worker import BatchPlan

#: The workers of an epoch: transforming (and calling a sync ``__getitem__``), or fetching too.
Pool = ProcessPool | WorkerGroup


class WorkerLease:
    """One epoch's use of a pool: ``async with lease as pool``.

    Args:
        pool: The pool (started already when ``started``).
        owned: The epoch owns the pool: it is shut down when the lease exits.
        failure: The pool failed to start (a fork-now start): raised on entry.
    """

    def __init__(
        self, pool: Pool, owned: bool, started: bool, failure: BaseException | None = None
    ) -> None:
        self._pool: Pool | None = pool
        self._owned = owned
        self._started = started
        self._failure = failure
        #: The pool's processes once started (kept after it stops), for DataLoader's
        #: ``iterator._workers``; ``ready`` is set then, or once it failed or was left
        #: (:meth:`_leave`, which every exit of an entered lease and :meth:`abandon` reach).
        self.processes: list[Any] = []
        self.ready = threading.Event()
        # An epoch dropped before it entered its lease (closed at once, or never iterated)
        # still shuts the pool it owns, at the latest when the lease is collected.
        self._finalizer = finalize_here(self, pool.shutdown) if owned else None
        if started:
            self._settled(pool if failure is None else None)

    def _settled(self, pool: Pool | None) -> None:
        if pool is not None:
            self.processes = pool.processes
        self.ready.set()

    async def __aenter__(self) -> Pool:
        pool = self._pool
        assert pool is not None, "a WorkerLease is entered once"
        if self._failure is not None:
            raise self._failure
        if not self._started:
            try:
                await run_in_thread(pool.start, "asyncloader-start")
            except BaseException:
                await self.__aexit__()
                raise
            self._settled(pool)
        return pool

    async def __aexit__(self, *exc_info: object) -> None:
        # An epoch-owned pool's queues and locks are named semaphores in /dev/shm while
        # referenced: let them go with the epoch, not with the loader.
        pool = self._leave()
        if pool is not None:
            await run_in_thread(pool.shutdown, "asyncloader-reaper")

    def abandon(self) -> None:
        """Shuts down the owned pool of a lease never entered (its epoch never started);
        idempotent, and a no-op once the lease was entered and left."""
        pool = self._leave()
        if pool is not None:
            pool.shutdown()

    def _leave(self) -> Pool | None:
        """Ends the lease once: the pool to shut down, when the epoch owned it."""
        pool, self._pool = self._pool, None
        self.ready.set()
        if self._finalizer is not None:
            self._finalizer.detach()
        return pool if self._owned else None


class Workers:
    """A loader's worker processes: one pool per epoch, or one persistent pool.

    Thread-safe: :meth:`lease` runs on the consumer's thread and :meth:`close` may run on any
    thread (the loader's finalizer included); the persistent pool is swapped under a lock.
    """

    def __init__(self, options: Options) -> None:
        self._options = options
        if options.engine is None:
            prestart(options.num_workers, options.mp_context)
        self._lock = threading.Lock()
        self._pool: Pool | None = None  # the persistent pool
        self._persistent_seed: int | None = None

    def lease(self, epoch_seed: int, options: Options | None = None) -> WorkerLease | None:
        """The pool of the epoch about to start (``None`` without workers), with ``options``
        the epoch's (the loader's by default; ``num_workers="auto"`` moves the count).

        Workers seed from ``epoch_seed``, or, when persistent, from the first epoch's seed.
        """
        options = options or self._options
        if not options.num_workers:
            self.close()  # "auto" went down to none: a persistent pool has nothing to do
            return None
        base_seed = epoch_seed
        if options.persistent_workers:
            if self._persistent_seed is None:
                self._persistent_seed = epoch_seed
            base_seed = self._persistent_seed
        ctx = options.mp_context or default_mp_context()
        fork_now = options.engine is None and forks(ctx)
        pool, owned = self._pool_for(options, base_seed, ctx)
        if not fork_now:
            return WorkerLease(pool, owned, started=False)
        warm_for_fork()
        try:
            with heap_frozen():
                pool.launch(loops_parked())
        except Exception as exc:
            if owned:
                pool.shutdown()
            return WorkerLease(pool, owned, started=True, failure=exc)
        # Forked now; their worker_init_fn is waited for on entry, while the epoch's first
        # indices are drawn here (as DataLoader's workers start while its sampler does).
        return WorkerLease(pool, owned, started=False)

    def _pool_for(self, options: Options, base_seed: int, ctx: Any) -> tuple[Pool, bool]:
        """A new pool owned by the epoch, or the persistent one (replaced when broken or of
        another size)."""
        plan = BatchPlan.of(options)

        def new() -> Pool:
            if options.engine is not None:
                bound: Pool = options.engine.bind(options, plan, base_seed)
                return bound
            kind = WorkerGroup if options.fetch_in_workers else ProcessPool
            return kind(options, plan, base_seed, ctx)

        if not options.persistent_workers:
            return new(), True
        with self._lock:
            pool = self._pool
            resized = pool is not None and pool.num_workers != options.num_workers
            stale = pool if pool is not None and (pool.broken or resized) else None
            if self._pool is None or stale is not None:
                self._pool = new()
            pool = self._pool
        if stale is not None:
            stale.shutdown()  # dead or idle workers: quick
        return pool, False

    def close(self, warn: bool = False) -> None:
        """Shuts the persistent pool down (blocking). Idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        if warn:
            warnings.warn(
                "AsyncLoader with persistent_workers was never closed; call close() or use "
                "it as a context manager",
                ResourceWarning,
                stacklevel=2,
            )
        pool.shutdown()
