"""AsyncLoader: the public loader, its async and sync iteration, and its lifecycle."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import torch

from asyncloader._async import AsyncIterator
from asyncloader._batches import start_sampler
from asyncloader._config import build_config, fork_is_safe
from asyncloader._pipeline import Epoch, LoaderStats, PoolProvider, batch_plan
from asyncloader._pool import ProcessPool
from asyncloader._state import (
    STATE_VERSION,
    capture_rng,
    check_state,
    decode_rng,
    describe_config,
    encode_rng,
    resume_point,
)
from asyncloader._sync import SyncIterator
from asyncloader._threads import keep_torch_threads, run_in_thread
from asyncloader._worker import BatchPlan

_FORK = (
    multiprocessing.get_context("fork")
    if "fork" in multiprocessing.get_all_start_methods()
    else None
)


def _draw_seed(generator: torch.Generator | None) -> int:
    """A base seed drawn as DataLoader draws it, so a seeded generator gives the same shuffle."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class _Resources:
    """What a loader owns beyond one epoch: the persistent pool. Shared with its finalizer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: ProcessPool | None = None

    def close(self, warn: bool = False) -> None:
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            if warn:
                warnings.warn(
                    "AsyncLoader with persistent_workers was never closed; call close() or use "
                    "it as a context manager",
                    ResourceWarning,
                    stacklevel=2,
                )
            pool.shutdown()


class AsyncLoader:
    """Loads batches from ``dataset``: IO on an event loop, CPU work in a process pool.

    Arguments mean what they mean for ``torch.utils.data.DataLoader`` where it has them, so
    ``DataLoader(`` can be replaced by ``AsyncLoader(``.

    Args:
        dataset: Map-style (sync or ``async def __getitem__``) or iterable (``__iter__`` or
            ``__aiter__``); torch ``Dataset`` and ``IterableDataset`` objects work unchanged.
            Iterables are pulled once, in this process: workers never duplicate them.
        batch_size: Samples per batch; ``None`` yields single samples (as DataLoader).
        shuffle: Reshuffle every epoch (``RandomSampler`` with ``generator``).
        sampler: Any torch ``Sampler`` or iterable of indices (``DistributedSampler``...).
        batch_sampler: Yields lists of indices; exclusive with batch_size, shuffle, sampler,
            drop_last.
        drop_last: Drop the last incomplete batch.
        collate_fn: Turns a list of samples into a batch; default ``default_collate``.
        transform: Picklable ``fn(sample) -> sample``, run in the executor before collate.
        num_workers: Worker processes to start (transform and collate run there, and a sync
            ``__getitem__`` too); 0 runs them in threads of this process.
        executor: Any ``concurrent.futures.Executor`` to use instead of asyncloader's pool
            (exclusive with num_workers; size the window with ``prefetch``).
        io_concurrency: Samples at most being fetched at once on the event loop (a sync
            ``__getitem__`` with num_workers=0 runs in up to this many threads).
        prefetch: Batches in the executor per worker (per executor without workers).
        in_order: Yield batches in sampler order; ``False`` yields them as they complete.
        pin_memory: Pin batches in page-locked memory, on the ``asyncloader-device`` thread
            (without CUDA: one warning, batches pass through).
        device: Copy batches to this device on the ``asyncloader-device`` thread and its own
            CUDA stream, at most 2 batches ahead; the batch you get is safe on your stream.
        timeout: Seconds to wait for one batch; 0 waits for ever. Raises LoaderTimeoutError.
        worker_init_fn: Called as ``fn(worker_id)`` in each worker after seeding.
        persistent_workers: Keep the worker processes across epochs.
        mp_context: Start method name or multiprocessing context for the workers. Default:
            on Linux ``fork`` when the epoch starts in the main thread of a process with no
            other thread (DataLoader's situation; the workers are forked before the loader
            starts any thread), else ``forkserver`` (fork after threads can deadlock);
            ``spawn`` elsewhere.
        generator: ``torch.Generator`` for shuffling and the workers' base seed.
        seed_per_sample: Seed the global ``torch``, ``random`` and ``numpy`` RNGs from
            ``(epoch seed, sample index)`` before each sample's ``__getitem__`` and
            ``transform`` (and from the batch before collate), so that with a seeded
            ``generator`` an epoch, random augmentations included, is bit-identical whatever
            ``num_workers`` and ``io_concurrency``. Off by default: with ``num_workers=0`` it
            reseeds this process's RNGs (your model's too) and runs a sync ``__getitem__`` one
            at a time; an ``async def __getitem__`` is not covered (keep randomness in
            ``transform``).

    Memory bound: at most ``stats.window`` batches are taken from the sampler and not yet
    handed to the consumer: ``prefetch * max(1, num_workers)`` in the executor plus, where
    samples are fetched in this process, ``ceil(io_concurrency / batch_size)`` being fetched,
    plus 2 in the device stage when there is one.
    """

    def __init__(
        self,
        dataset: Any,
        /,
        *,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        executor: Executor | None = None,
        io_concurrency: int = 64,
        prefetch: int = 2,
        in_order: bool = True,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        persistent_workers: bool = False,
        mp_context: Any = None,
        generator: torch.Generator | None = None,
        seed_per_sample: bool = False,
    ) -> None:
        self._cfg = build_config(
            dataset,
            batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, drop_last=drop_last, collate_fn=collate_fn,
            transform=transform, num_workers=num_workers, executor=executor,
            io_concurrency=io_concurrency, prefetch=prefetch, in_order=in_order,
            pin_memory=pin_memory, device=device, timeout=timeout,
            worker_init_fn=worker_init_fn, persistent_workers=persistent_workers,
            mp_context=mp_context, generator=generator, seed_per_sample=seed_per_sample,
        )  # fmt: skip
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close, True)
        self._iterators: weakref.WeakSet[SyncIterator] = weakref.WeakSet()
        self._epochs: weakref.WeakSet[Epoch] = weakref.WeakSet()
        self._last: Epoch | None = None
        self._persistent_seed: int | None = None
        self._epoch = -1
        self._resume: dict[str, Any] | None = None

    # DataLoader's attributes, read-only.
    dataset = property(lambda self: self._cfg.dataset)
    batch_size = property(lambda self: self._cfg.batch_size)
    drop_last = property(lambda self: self._cfg.drop_last)
    sampler = property(lambda self: self._cfg.sampler)
    batch_sampler = property(lambda self: self._cfg.batch_sampler)
    num_workers = property(lambda self: self._cfg.num_workers)
    generator = property(lambda self: self._cfg.generator)

    def __len__(self) -> int:
        """Batches per epoch. Raises TypeError when the source has no length."""
        cfg = self._cfg
        if cfg.kind.is_map:
            return len(cfg.batch_sampler if cfg.batch_sampler is not None else cfg.sampler)
        n = len(cfg.dataset)
        if cfg.batch_size is None:
            return n
        return n // cfg.batch_size if cfg.drop_last else -(-n // cfg.batch_size)

    @property
    def stats(self) -> LoaderStats:
        """Counters of the current (or last) epoch: window, high-water marks, batches."""
        if self._last is None:
            cfg = self._cfg
            return LoaderStats(cfg.window, 0, cfg.io_concurrency, 0, 0)
        return self._last.stats

    def _new_epoch(self) -> Epoch:
        keep_torch_threads()  # on the consumer's thread, before the epoch starts any thread
        cfg = self._cfg
        resume, saved = self._resume, None
        self._resume = None
        rng = decode_rng(resume["rng"]) if resume else None
        if rng is not None and rng[0] == "generator" and cfg.generator is not None:
            cfg.generator.set_state(rng[1])
        if rng is not None and rng[0] == "global":
            saved = torch.get_rng_state()
            torch.set_rng_state(rng[1])
        try:
            rng = capture_rng(cfg.generator)
            seed = _draw_seed(cfg.generator)  # before the sampler draws, as DataLoader does
            # Start the sampler here, on the consumer's thread, so that its draws happen now
            # (as in DataLoader) and not whenever the loop thread gets to them.
            index_iter = start_sampler(cfg) if cfg.kind.is_map else None
        finally:
            if saved is not None:
                torch.set_rng_state(saved)
        base_seed = seed
        if cfg.num_workers and cfg.persistent_workers:
            if self._persistent_seed is None:
                self._persistent_seed = seed
            base_seed = self._persistent_seed
        self._epoch = resume["epoch"] if resume else self._epoch + 1
        acquire: PoolProvider = lambda plan: self._acquire_pool(plan, base_seed)  # noqa: E731
        if cfg.num_workers and cfg.mp_context is None and fork_is_safe():
            acquire = self._forked_now(base_seed)
        self._last = Epoch(
            cfg,
            acquire,
            seed,
            rng=rng,
            index_iter=index_iter,
            resume=resume_point(resume) if resume else None,
        )
        self._epochs.add(self._last)
        return self._last

    def state_dict(self) -> dict[str, Any]:
        """What the consumer has received so far, to continue from after a restart.

        A small, picklable and JSON-friendly dict: the epoch, the RNG state it started from,
        which of its batches were delivered, and an iterable source's own ``state_dict()``
        before the first batch not delivered. Batches in flight are not part of it: they are
        fetched again on resume.
        """
        cfg, epoch = self._cfg, self._last
        if epoch is not None and not epoch.finished:
            position = {"epoch": self._epoch, "rng": encode_rng(epoch.rng), **epoch.checkpoint()}
        else:
            rng = capture_rng(cfg.generator) if cfg.generator is not None else None
            position = {
                "epoch": self._epoch + 1,
                "rng": encode_rng(rng),
                "next_batch": 0,
                "delivered_beyond": [],
                "source_state": None,
            }
        return {"version": STATE_VERSION, **describe_config(cfg), **position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration continue exactly where ``state`` was saved.

        ``num_workers``, ``io_concurrency``, ``prefetch`` and ``in_order`` may differ from the
        saving loader; ``batch_size`` and the sampler's world size may not. A
        ``DistributedSampler``'s epoch is yours to set, as for every epoch.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: It comes from another version, batch size or world size.
        """
        check_state(state, self._cfg)
        self._resume = state

    def _forked_now(self, base_seed: int) -> PoolProvider:
        """Forks the workers now, before the epoch starts any thread: as quick as DataLoader's
        start, without fork's danger (no other thread can be holding a lock). A failure to
        start is raised from the epoch's first step, as with the other start methods."""
        pool, owned = self._pool_for(batch_plan(self._cfg), base_seed, _FORK)
        try:
            pool.start()
            failure = None
        except Exception as exc:
            failure = exc
            if owned:
                pool.shutdown()

        async def acquire(plan: BatchPlan) -> tuple[ProcessPool, bool]:
            if failure is not None:
                raise failure
            return pool, owned

        return acquire

    def _pool_for(
        self, plan: BatchPlan, base_seed: int, ctx: Any = None
    ) -> tuple[ProcessPool, bool]:
        """A new pool owned by the epoch, or the persistent one (replaced when broken)."""
        cfg, res = self._cfg, self._resources
        if not cfg.persistent_workers:
            return ProcessPool(cfg, plan, base_seed, ctx), True
        with res.lock:
            stale = res.pool if res.pool is not None and res.pool.broken else None
            if res.pool is None or stale is not None:
                res.pool = ProcessPool(cfg, plan, base_seed, ctx)
            pool = res.pool
        if stale is not None:
            stale.shutdown()  # already dead workers: quick
        return pool, False

    async def _acquire_pool(self, plan: BatchPlan, base_seed: int) -> tuple[ProcessPool, bool]:
        pool, owned = self._pool_for(plan, base_seed)
        try:
            await run_in_thread(pool.start, "asyncloader-start")
        except BaseException:
            if owned:
                await run_in_thread(pool.shutdown, "asyncloader-reaper")
            raise
        return pool, owned

    def __aiter__(self) -> AsyncIterator:
        return AsyncIterator(self._new_epoch(), self._cfg.timeout)

    def __iter__(self) -> SyncIterator:
        it = SyncIterator(self._new_epoch(), self._cfg.timeout)
        self._iterators.add(it)
        return it

    def close(self) -> None:
        """Stops running ``for`` epochs and the persistent workers. Idempotent.

        Epochs iterated with ``async for`` run on an event loop: close them with :meth:`aclose`.
        """
        for it in list(self._iterators):
            it.close()
        self._finalizer.detach()
        self._resources.close()

    async def aclose(self) -> None:
        """Stops every running epoch (a ``break`` already cancelled, too) and the persistent
        workers, and waits until their threads and processes are joined. Idempotent."""
        loop = asyncio.get_running_loop()
        for epoch in list(self._epochs):
            if epoch.loop is loop:
                await epoch.aclose()
        for it in list(self._iterators):
            await run_in_thread(it.close, "asyncloader-reaper")
        self._finalizer.detach()
        await run_in_thread(self._resources.close, "asyncloader-reaper")

    def __enter__(self) -> AsyncLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> AsyncLoader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
