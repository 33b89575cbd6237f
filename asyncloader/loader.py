"""AsyncLoader: the public loader, its async and sync iteration, and its lifecycle."""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import AsyncIterable, Callable, Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from torch.utils.data import Dataset

from asyncloader._base import MapStyle, finalize_here, tracing, warn_many_workers
from asyncloader._config import Options, loader_options
from asyncloader._engines import Workers
from asyncloader._pipeline import (
    AsyncIterator,
    DataLoaderAttributes,
    Epoch,
    LoaderEpochs,
    LoopThread,
    SyncIterator,
    aclose_loader,
    close_loader,
    loaded_state,
    release,
    tell_rank,
)
from asyncloader._tuning import Diagnosis, LoaderStats, PageData, diagnose, render, render_page

T_co = TypeVar("T_co", covariant=True)


def _restored(
    cls: type[AsyncLoader[Any]], options: Options, epoch: int, resume: dict[str, Any] | None
) -> AsyncLoader[Any]:
    """A loader of ``options`` at ``epoch``, with ``resume`` loaded (see ``__reduce__``)."""
    loader = cls.__new__(cls)
    loader._options = options
    loader._setup()
    loader._across.number, loader._across.resume = epoch, resume
    return loader


class AsyncLoader(DataLoaderAttributes, Generic[T_co]):
    """Loads batches from ``dataset``: IO on an event loop, CPU work in a process pool.

    Arguments mean what they mean for ``torch.utils.data.DataLoader`` where it has them, so
    ``DataLoader(`` can be replaced by ``AsyncLoader(``.

    Args:
        dataset: Map-style (sync or ``async def __getitem__``) or iterable (``__iter__`` or
            ``__aiter__``); torch ``Dataset`` and ``IterableDataset`` objects work unchanged.
            Iterables are pulled once, in this process, unless ``fetch_in_workers``.
            A map-style dataset may supply its own sampler (``asyncloader.sources.Mix`` of
            map-style sources does): ``dataset.loader_sampler()``, called once here, is the
            sampler, each ``iter()`` of it one epoch of keys for ``__getitem__``, this
            rank's share (the dataset splits itself: told its place with ``set_rank`` and
            each epoch with the sampler's ``set_epoch`` under ``distributed``). It is batched
            by ``batch_size`` and ``drop_last``; ``shuffle=True``, ``sampler`` and
            ``batch_sampler`` raise ``ValueError``. If the dataset has ``state_dict()`` and
            ``load_state_dict()``, its state must say where its sampler stands (a new value
            each call): the loader reads it after each batch it takes from the sampler,
            saves the one at the first batch not received (``dataset_state``), and on
            resume loads it and goes on from that batch without running the sampler through
            the ones before; without them the sampler is stepped over, as any sampler is.
        batch_size: Samples per batch; ``None`` yields single samples (as DataLoader).
        shuffle: Reshuffle every epoch (``RandomSampler`` with ``generator``).
        sampler: Any torch ``Sampler`` or iterable of indices (``DistributedSampler``...).
        batch_sampler: Yields lists of indices; exclusive with batch_size, shuffle, sampler,
            drop_last.
        num_workers: Worker processes to start (transform and collate run there, and a sync
            ``__getitem__`` too); 0 runs them in threads of this process. More workers than
            cores warns, as DataLoader does. ``"auto"``: the first epoch gets the usable cores
            (shared among torchrun's ``LOCAL_WORLD_SIZE`` ranks), or none where the workers
            would only collate what this process's loop fetched (an async or iterable source
            without ``transform`` or ``collate_fn``); between epochs, one more when the last
            epoch was CPU-bound and that pays, one fewer when workers sat idle under a slow
            consumer, never above the cores nor ``memory_budget``
            (:mod:`asyncloader._tuning.autosize`). Within an epoch the count never changes.
        collate_fn: Turns a list of samples into a batch; default ``default_collate``.
        pin_memory: Pin batches in page-locked memory, on the ``asyncloader-device`` thread
            (without CUDA: one warning, batches pass through).
        drop_last: Drop the last incomplete batch.
        timeout: Seconds to wait for one batch; 0 waits for ever. Raises LoaderTimeoutError.
        worker_init_fn: Called as ``fn(worker_id)`` in each worker after seeding. If it seeds
            or draws from the global RNGs, the seeding of that worker is its own (batches are
            not reseeded there; see ``generator``).
        multiprocessing_context: Start method name or multiprocessing context for the workers
            (``mp_context`` is the same option). Default: DataLoader's, ``multiprocessing``'s
            default start method (``fork`` on Linux before Python 3.14), whatever threads
            run. Forked workers fork at ``iter()`` with asyncloader's own threads parked;
            with a start method that pickles, what cannot be pickled raises ``TypeError``
            there, naming it, before any process starts.
        generator: ``torch.Generator`` for shuffling and the epoch's seed. Worker ``i`` starts
            from ``seed + i`` (DataLoader's rule, ``get_worker_info().seed``); then each batch
            a worker runs seeds its global RNGs from ``(epoch seed, batch number)``, so random
            augmentations in ``__getitem__``, ``transform`` and ``collate_fn`` repeat with the
            same seed for any ``num_workers`` and after resume. Batches made in this process
            (``num_workers=0``) draw from your global RNGs, as under DataLoader.
        prefetch_factor: DataLoader's name for ``prefetch``; only with workers, as there.
        persistent_workers: Keep the worker processes across epochs.
        pin_memory_device: Accepted for DataLoader's signature; pinning is for CUDA.
        in_order: Yield batches in sampler order; ``False`` yields them as they complete.
        transform: Picklable ``fn(sample) -> sample``, run in the executor before collate.
        executor: Any ``concurrent.futures.Executor`` to use instead of asyncloader's pool
            (exclusive with num_workers; size the window with ``prefetch``).
        engine: Where the workers run instead of this machine's processes:
            ``asyncloader.ray.RayEngine(num_workers=N, **actor_options)`` runs them as Ray
            actors on the connected cluster. Its ``num_workers`` is the loader's; the workers
            fetch as with ``fetch_in_workers``. Exclusive with ``executor``.
        io_concurrency: Samples at most being fetched at once: on the event loop, or in
            total across the workers with ``fetch_in_workers``. Default ``"auto"``: the limit
            starts at 64 and grows while growing raises the samples/s of a fetch that is at
            its limit, up to 4096, to ``memory_budget`` and to half the files the process may
            still open (it steps back when a step does not pay, and probes again a second
            later, so it follows a change in latency); the window of batches follows it (see
            :mod:`asyncloader._tuning.io_limit`). An int fixes it. A sync ``__getitem__`` without
            workers is called ``fetch_threads`` at a time whatever this says.
        memory_budget: With an ``"auto"`` setting: bytes the samples in flight may hold
            (``io_concurrency``), and bytes the batches in the engine's window may grow to
            (``num_workers`` and ``prefetch``; never below what ``prefetch=2`` holds), each a
            bound of its own; sizes are measured from the first samples and the first batch.
            Default 1 GiB.
        fetch_in_workers: Fetch in the workers too (needs ``num_workers > 0``): each worker
            runs its own event loop (uvloop when installed), fetches the samples of the
            batches it is given (an ``async def __getitem__`` and the library's sources with a
            connection pool per worker; a sync ``__getitem__`` on ``fetch_threads`` threads
            of each worker), transforms and collates them, so this process only samples,
            reorders and copies. An iterable source then runs in the workers as under
            DataLoader: each worker iterates its own copy (``get_worker_info()`` tells it which
            one; the library's sharded sources split their shards by worker), and batches are
            taken from the workers round robin. Default ``False``: an async or iterable source
            is read on this process's event loop, a sync ``__getitem__`` in the workers.
        fetch_threads: With ``num_workers=0``, threads calling a sync ``__getitem__`` at
            once. Default 1: one call at a time, as DataLoader does, for datasets that are not
            thread-safe (an open file, a seeded RNG, a lazily opened database). Raise it (up
            to ``io_concurrency``) for a thread-safe ``__getitem__`` that waits on IO.
        prefetch: Batches in the executor per worker (per executor without workers). Default
            ``"auto"``: starts at 2 (DataLoader's ``prefetch_factor``) and, while the epoch
            runs, doubles when the consumer waits on a full window and that raises batches/s
            by 10%, up to 16 and to ``memory_budget`` (never below 2; it steps back when a
            doubling does not pay); the window follows it. An int fixes it.
            ``prefetch_factor`` is the same option.
        device: Copy batches to this device on the ``asyncloader-device`` thread and its own
            CUDA stream, at most 2 batches ahead; the batch you get is safe on your stream.
        device_transform: ``fn(batch) -> batch`` run on the ``asyncloader-device`` thread after
            the copy to ``device`` (on its stream, so on a GPU it overlaps your step), or on
            the batch as it is without ``device``: work that is cheap on the device and
            costly on the workers, such as normalising ``uint8`` images
            (:class:`asyncloader.images.Normalize`). Its errors fail the batch (stage
            ``device``).
        mp_context: ``multiprocessing_context``, by asyncloader's shorter name.
        seed_per_sample: Seed the global ``torch``, ``random`` and ``numpy`` RNGs from
            ``(epoch seed, sample index)`` before each sample's ``__getitem__`` and
            ``transform`` (and from the batch before collate), so that with a seeded
            ``generator`` an epoch is bit-identical whatever ``num_workers`` (0 included) and
            ``io_concurrency``. Off by default: with ``num_workers=0`` it reseeds this
            process's RNGs (your model's too) and runs a sync ``__getitem__`` one at a time;
            an ``async def __getitem__`` is not covered (keep randomness in ``transform``).
        on_error: ``"raise"`` (default): a sample's exception fails its batch. ``"skip"``: a
            sample whose ``__getitem__`` or ``transform`` raises an ``Exception`` is left out
            of its batch, which is yielded smaller (not at all when every sample was left
            out; it still counts as received for ``state_dict()``). Each skip is counted
            (``stats.skipped``), kept in ``skip_log`` and logged as a warning on the
            ``asyncloader`` logger with its stage, batch and index. ``collate_fn`` errors and
            an iterable source's own iterator errors are never skipped.
        max_skipped: With ``on_error="skip"`` (and required there): the most samples to skip
            per epoch; the next bad sample fails its batch with its own exception and a note
            that the budget is spent (that step raises, the epoch goes on).
        snapshot_every_n_steps: Accepted for torchdata ``StatefulDataLoader``'s signature:
            ``state_dict()`` is exact at every step, whatever its value.
        distributed: Partition each epoch across ranks and advance it on each ``iter()``, with
            no ``set_epoch`` call: each ``iter()`` is the next epoch, a new order, the same on
            every rank. A map-style source without ``sampler``/``batch_sampler`` gets the
            loader's own sampler: one permutation per epoch (``shuffle``; seeded by
            ``generator``'s initial seed, else 0, and the epoch; ``DistributedSampler``'s
            partition) split so that every rank gets the same number of batches; its
            ``state_dict()`` resumes at another world size too (elastic, see
            :meth:`load_state_dict`). Your own ``sampler``/``batch_sampler`` partitions
            itself and is told the epoch (``set_epoch``). An iterable source partitions
            itself: it is told its place once (``set_rank(rank, world_size)``) and each epoch
            (``set_epoch(epoch)``, in the workers too with ``fetch_in_workers``) when it has
            those methods, as ``ShardedSource`` does; with ``elastic_state`` too, as
            ``ShardedSource``, its position resumes at another world size.
        rank, world_size: With ``distributed``: this process's place; default
            ``torch.distributed``'s when initialised at an epoch's start (so the loader may
            be built before ``init_process_group``), else a single rank.
        distributed_tail: With ``distributed``, when the dataset does not divide evenly:
            ``"pad"`` (default, as ``DistributedSampler``): the first samples of the
            permutation are repeated to fill the last ranks; ``"drop"``: fewer than
            ``world_size`` samples are left out of the epoch. Exactly once holds with
            ``"drop"``, and with ``"pad"`` when ``len(dataset)`` divides evenly.

    The arguments up to ``generator`` may be passed positionally, in DataLoader's order.
    DataLoader's attributes (``dataset``, ``batch_size``, ``sampler``...) are read-only;
    assigning one of those DataLoader fixes raises ``ValueError``, as there.

    Memory bound: at most ``stats.window`` batches are taken from the sampler and not yet
    handed to the consumer: ``prefetch * max(1, num_workers)`` in the executor (``prefetch``
    at 16 under ``prefetch="auto"``, the default; the epoch's ``num_workers``) plus, where
    samples are fetched in this process, ``ceil(io_concurrency / batch_size)`` being fetched
    (``fetch_threads`` in place of ``io_concurrency`` for a sync ``__getitem__``),
    plus 2 in the device stage when there is one.
    """

    def __init__(
        self,
        dataset: Dataset[T_co] | MapStyle[T_co] | Iterable[T_co] | AsyncIterable[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        transform: Callable[[Any], Any] | None = None,
        executor: Executor | None = None,
        engine: Any = None,
        io_concurrency: int | str = "auto",
        fetch_in_workers: bool = False,
        fetch_threads: int = 1,
        prefetch: int | str | None = None,
        device: str | torch.device | None = None,
        device_transform: Callable[[Any], Any] | None = None,
        mp_context: Any = None,
        seed_per_sample: bool = False,
        on_error: str = "raise",
        max_skipped: int | None = None,
        snapshot_every_n_steps: int = 1,
        distributed: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        distributed_tail: str = "pad",
        memory_budget: int | None = None,
    ) -> None:
        self._options = loader_options(
            type(self).__name__,
            prefetch_factor=prefetch_factor, multiprocessing_context=multiprocessing_context,
            snapshot_every_n_steps=snapshot_every_n_steps, dataset=dataset,
            batch_size=batch_size, shuffle=shuffle, sampler=sampler,
            batch_sampler=batch_sampler, drop_last=drop_last, collate_fn=collate_fn,
            transform=transform, executor=executor, engine=engine, num_workers=num_workers,
            prefetch=prefetch, io_concurrency=io_concurrency, fetch_in_workers=fetch_in_workers,
            fetch_threads=fetch_threads,
            in_order=in_order, pin_memory=pin_memory, pin_memory_device=pin_memory_device,
            device=device, device_transform=device_transform, timeout=timeout,
            worker_init_fn=worker_init_fn,
            persistent_workers=persistent_workers, mp_context=mp_context, generator=generator,
            seed_per_sample=seed_per_sample, on_error=on_error, max_skipped=max_skipped,
            distributed=distributed, rank=rank, world_size=world_size,
            distributed_tail=distributed_tail, memory_budget=memory_budget,
        )  # fmt: skip
        warn_many_workers(type(self).__name__, num_workers)
        tell_rank(self._options)
        tracing.from_environment()  # ASYNCLOADER_TRACE=<dir>: this process records from now on
        self._setup()

    def _setup(self) -> None:
        """What a loader keeps across epochs, made from its options (none of it is copied:
        see :meth:`__reduce__`)."""
        self._workers = Workers(self._options)
        self._loop_thread = LoopThread()  # where `for` epochs run, kept across them
        self._finalizer = finalize_here(self, release, self._workers, self._loop_thread, True)
        self._iterators: weakref.WeakSet[SyncIterator] = weakref.WeakSet()
        self._across = LoaderEpochs(self._options)

    #: The current (or last) epoch (read by diagnose and tests).
    _last = property(lambda self: self._across.last)
    _epochs = property(lambda self: self._across.running)

    def __len__(self) -> int:
        """Batches per epoch. Raises TypeError when the source has no length.

        For an iterable source, as DataLoader: each batch an epoch begun afterwards yields
        past this length warns (a replica not split per worker yields more than its length).
        """
        return self._across.count_batches(self._options)

    @property
    def stats(self) -> LoaderStats:
        """Counters and per-stage figures of the current (or last) epoch: window, high-water
        marks, batches, skips, throughput, fetch latency, time in the engine and the device
        stage, the consumer's stalls (see :class:`LoaderStats`). ``stats.as_dict()`` is the
        form for a metrics logger."""
        return self._across.stats(self._options)

    @property
    def previous_stats(self) -> LoaderStats | None:
        """The :attr:`stats` of the epoch before the current (or last) one, if any."""
        return self._across.previous

    def report(self, html: str | os.PathLike[str] | None = None) -> str:
        """A short summary of the current (or last) epoch that names the stage holding it
        back, with the evidence and the option that would move it, then one line per stage::

            bottleneck: storage: waiting on storage: fetch p50 20.1 ms, p99 20.9 ms, 64 of
            64 in flight on average (at the limit); raise io_concurrency (now 64; try 128)

        The stage is one of ``consumer`` (the training step; the loader keeps up),
        ``device``, ``cpu`` (the workers), ``storage``, ``source``, or ``unknown`` before three
        batches (the rules: :mod:`asyncloader._tuning.report`).

        With ``html``, also writes the report there as one self-contained page (it opens
        offline): the verdict, each stage's utilisation, the consumer's wait per batch, the
        tuners' decisions, and inside :func:`asyncloader.trace` a timeline of the stages.
        """
        stats = self.stats
        diagnosis = diagnose(stats, self._epoch_options)
        text = render(stats, diagnosis, max(self._across.number, 0))
        if html is not None:
            title = f"asyncloader report: {type(self).__name__}, epoch {self._across.number}"
            Path(html).write_text(render_page(stats, diagnosis, self._page_data(), title))
        return text

    def _page_data(self) -> PageData:
        epoch = self._across.last
        recorder = tracing.ACTIVE
        events = recorder.trace_events() if recorder is not None else ()
        if epoch is None:
            return PageData((), (), events)
        meter = epoch.meter
        steps = [(step * 1e3, wait * 1e3) for step, wait in meter.steps]
        tuned = [(at - meter.started, lim, pre, win) for at, lim, pre, win in meter.tuned]
        return PageData(steps, tuned, events)

    def stats_by_rank(self) -> list[LoaderStats]:
        """:attr:`stats` of every rank, in rank order (their ``wait_p50_ms``, ``wait_p95_ms``
        and ``wait_p99_ms`` say which rank stalls on data). A collective while
        ``torch.distributed`` is initialised: every rank calls it, at the same point; else
        ``[self.stats]``."""
        stats = self.stats
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return [stats]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, stats)
        return gathered

    def bottleneck(self) -> Diagnosis:
        """The bottleneck :meth:`report` names: ``.stage``, ``.evidence`` and ``.knob``."""
        return diagnose(self.stats, self._epoch_options)

    @property
    def skip_log(self) -> list[tuple[Any, str]]:
        """The last 16 samples ``on_error="skip"`` left out, across epochs, oldest first:
        ``(index, "ExceptionType: message")``."""
        return list(self._across.skip_log)

    def _new_epoch(self) -> Epoch:
        return self._across.start(self._options, self._workers)

    def state_dict(self) -> dict[str, Any]:
        """What the consumer has received so far, to continue from after a restart.

        A small, picklable and JSON-friendly dict: the epoch, the RNG state it started from,
        which of its batches were delivered, and an iterable source's own ``state_dict()``
        before the first batch not delivered. Batches in flight are not part of it: they are
        fetched again on resume. The source's own state sits where ``StatefulDataLoader``
        puts it: ``dataset_state`` and ``fetcher_state``, or per worker in
        ``_snapshot["_worker_snapshots"]["worker_<i>"]`` (see
        :mod:`asyncloader._checkpoint.layout`).

        Between epochs (before the first, after one ended) it names the next epoch, the RNG
        state its shuffle will draw from (the ``generator``'s, or torch's global one) and the
        dataset's own ``state_dict()``. After :meth:`load_state_dict` and until an epoch
        starts from it (the next ``iter()`` that does not fail), it is the state loaded.
        The state (version 5) also records a map-style dataset's ``len()`` (``dataset_len``).
        """
        return self._across.state_dict(self._options)

    def load_state_dict(self, state: dict[str, Any], *, allow_length_change: bool = False) -> None:
        """Makes the next iteration continue exactly where ``state`` was saved.

        The whole state is checked before any of it is used: a state refused leaves the one
        the loader had (loaded or its own). A loaded state stays until an epoch starts from
        it: an ``iter()`` that fails on the way (the source's own ``load_state_dict``, say)
        leaves it for the next ``iter()``, and ``state_dict()`` returns it meanwhile.

        A map-style dataset of another ``len()`` than the state records is refused (its
        order would differ) unless ``allow_length_change=True``: the resumed epoch is then
        the order the saved RNG state draws for the new length, its first ``next_batch``
        batches stepped over (so samples of that epoch may repeat or be missed), and the
        epochs after it are those of an uninterrupted run on the new dataset. With
        ``distributed=True`` it takes a state saved between epochs, or one mid-epoch
        resumed at its own world size and never cut at another.

        ``num_workers``, ``io_concurrency``, ``prefetch`` and ``in_order`` may differ from the
        saving loader; ``batch_size`` and the sampler's world size may not. A
        ``DistributedSampler`` you pass keeps its epoch yours to set, as for every epoch
        (with ``distributed=True`` the loader sets it to the state's).

        Elastic resume (``distributed=True``, the loader's own sampler): the world size may
        differ. Ranks step together, so a state from any rank says how many samples every
        rank took; the new ranks split what the epoch had still to give among themselves,
        each sample once, and the next epoch is the one a fresh job at the new size has.
        Only an in-order position carries over (no batch delivered ahead of a missing one).
        An iterable source with ``elastic_state`` (``ShardedSource``) moves too: its
        streams' states (one per worker with ``fetch_in_workers``) become the one each new
        stream loads, so ``num_workers`` and ``fetch_in_workers`` may differ as well; the
        batch count goes on from the saved one.

        Raises:
            TypeError: ``state`` is not a dict, or ``allow_length_change`` not a bool.
            ValueError: A field is missing, of the wrong type or out of range (a position
                past the epoch's end, say), or the state comes from another version, batch
                size, world size, seed, shuffle, RNG kind (a ``generator`` or none),
                placement of an iterable source, or dataset length, or is an out-of-order
                position at another world size. The message names the field.
        """
        self._across.resume = loaded_state(state, self._options, allow_length_change)

    def __aiter__(self) -> AsyncIterator:
        return AsyncIterator(self._new_epoch(), self._options.timeout, owner=self)

    def __iter__(self) -> SyncIterator:
        epoch = self._new_epoch()
        epoch.scheduled()
        it = SyncIterator(epoch, self._options.timeout, self._loop_thread, owner=self)
        self._iterators.add(it)
        # As StatefulDataLoader's iter(): the workers' iterations are open when it returns,
        # so a state_dict() then holds what their __iter__ made, kept or dropped iterator.
        epoch.settle_source()
        return it

    def close(self) -> None:
        """Stops running ``for`` epochs, the loader's loop thread and the persistent workers.
        Idempotent; the loader may be iterated again afterwards.

        Epochs iterated with ``async for`` run on an event loop: close them with :meth:`aclose`.
        """
        close_loader(self._iterators, self._epochs, self._workers, self._loop_thread)

    async def aclose(self) -> None:
        """Stops every running epoch (a ``break`` already cancelled, too) and the persistent
        workers, and waits until their threads and processes are joined. Idempotent."""
        await aclose_loader(self._iterators, self._epochs, self._workers, self._loop_thread)

    def __reduce__(self) -> tuple[Any, ...]:
        """A pickle or a copy of a loader, as of a DataLoader, holds its configuration, the
        epoch it is at and the state given to :meth:`load_state_dict` and not yet used:
        never its loop thread, workers or running epochs (the copy starts its own).
        ``copy.deepcopy`` copies the dataset and shares a user's ``executor``; ``pickle``
        refuses a loader holding one, as it refuses the executor."""
        return _restored, (type(self), self._options, self._across.number, self._across.resume)

    def __deepcopy__(self, memo: dict[int, Any]) -> AsyncLoader[T_co]:
        executor = self._options.executor
        if executor is not None:
            memo.setdefault(id(executor), executor)  # the user's pool, not ours to copy
        args = copy.deepcopy(self.__reduce__()[1], memo)
        return _restored(*args)

    def __enter__(self) -> AsyncLoader[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> AsyncLoader[T_co]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
