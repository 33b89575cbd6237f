"""The options of one loader: one frozen dataclass, validated and completed once, in the
constructor.

``AsyncLoader.__init__`` passes its keywords here unchanged; :class:`Options` checks them (with
the checks of :mod:`asyncloader._base.validate`), derives the sampling chain DataLoader would build
(sampler, batch sampler, collate function) and fixes the bounds the pipeline lives by (the
window). Nothing downstream reads options by string key or validates them again.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from asyncloader._base import (
    STALL_DUMP_ENV,
    SourceKind,
    check_auto_batching,
    check_callable,
    check_engine,
    check_fetch_in_workers,
    check_instance,
    check_int,
    check_map_sampling,
    check_no_indices,
    check_num_workers,
    check_on_error,
    check_timeout,
    check_workers,
    has_getitems,
    is_auto,
    resolve_device,
    resolve_mp_context,
    resolve_ranks,
    source_kind,
    stall_dump_seconds,
    supplies_sampler,
)
from asyncloader._config.defaults import CAP as AUTO_CAP
from asyncloader._config.defaults import (
    DEFAULT_BUDGET,
    PREFETCH_CAP,
    PREFETCH_START,
    start_workers,
)
from asyncloader._config.rank_sampler import TAILS, RankSampler

DEVICE_DEPTH = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """The validated options of one loader (see AsyncLoader for their meaning).

    After construction ``sampler`` and ``batch_sampler`` are the ones the epoch iterates (built
    from ``shuffle``, ``batch_size`` and ``drop_last`` when not given), ``batch_size`` is
    ``None`` under a user ``batch_sampler`` (as in DataLoader), ``device`` is a
    ``torch.device`` and ``mp_context`` a multiprocessing context or ``None``.
    """

    dataset: Any
    batch_size: int | None = 1
    shuffle: bool | None = None
    sampler: Any = None
    batch_sampler: Any = None
    drop_last: bool = False
    collate_fn: Callable[[Any], Any] | None = None
    transform: Callable[[Any], Any] | None = None
    #: ``"auto"`` is accepted too: resolved to the first epoch's count (with auto_workers).
    num_workers: int = 0
    executor: Executor | None = None
    #: Where the workers run when not in this machine's processes (``RayEngine``): its
    #: ``num_workers`` become the loader's, and they fetch (``fetch_in_workers``).
    engine: Any = None
    io_concurrency: int | str = "auto"  # an int once built ("auto": the cap, with auto_io)
    fetch_in_workers: bool = False
    fetch_threads: int = 1
    #: ``"auto"`` (the loader's default) is accepted too: resolved to the start (with
    #: auto_prefetch).
    prefetch: int = 2
    in_order: bool = True
    pin_memory: bool = False
    pin_memory_device: str = ""
    device: str | torch.device | None = None  # a torch.device once built
    device_transform: Callable[[Any], Any] | None = None
    timeout: float = 0
    worker_init_fn: Callable[[int], None] | None = None
    persistent_workers: bool = False
    mp_context: Any = None
    generator: torch.Generator | None = None
    seed_per_sample: bool = False
    on_error: str = "raise"
    max_skipped: int | None = None
    #: Partition each epoch across ranks and advance it on each iter() (rank and world_size
    #: resolved from torch.distributed when not given; see asyncloader._config.rank_sampler).
    distributed: bool = False
    rank: int | None = None
    world_size: int | None = None
    distributed_tail: str = "pad"
    #: Bytes the samples in flight, and separately the batches in the window, may hold under
    #: the "auto" settings (None: the default, or no "auto").
    memory_budget: int | None = None
    #: The class the user instantiated (``AsyncLoader``, or their subclass), named in messages
    #: worded as DataLoader words them.
    loader_name: str = "AsyncLoader"
    #: Derived: the kind of source, and the function that turns samples into a batch.
    kind: SourceKind = field(init=False)
    collate: Callable[[Any], Any] = field(init=False)
    #: io_concurrency="auto": the fetch limit moves (asyncloader._tuning.io_limit), up to
    #: io_concurrency.
    auto_io: bool = field(init=False, default=False)
    #: num_workers="auto": each epoch's count moves (asyncloader._tuning.autosize); this object
    #: holds
    #: the first epoch's, :meth:`for_epoch` another's.
    auto_workers: bool = field(init=False, default=False)
    #: prefetch="auto": prefetch moves within the epoch, up to PREFETCH_CAP (the window's bound).
    auto_prefetch: bool = field(init=False, default=False)
    #: A sync map-style source with ``__getitems__``, batched, without seed_per_sample: one
    #: call fetches each batch, as under DataLoader (asyncloader._worker.getitems).
    batch_fetch: bool = field(init=False, default=False)
    #: Seconds without progress after which an epoch logs its state (None: off), from the
    #: environment variable ASYNCLOADER_STALL_DUMP (asyncloader._pipeline.stall_dump).
    stall_dump: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        kind = source_kind(self.dataset)
        self._resolve_auto(kind)
        self._check_plain()
        _set(self, device=resolve_device(self.device, bool(self.pin_memory)))
        _set(
            self,
            mp_context=resolve_mp_context(self.mp_context, self.num_workers, self.auto_workers),
        )
        self._resolve_ranks(kind)
        if kind.is_map:
            self._sample_map()
        else:
            for name in ("shuffle", "sampler", "batch_sampler"):
                check_no_indices(self.loader_name, name, getattr(self, name))
            check_auto_batching(self.batch_size, self.drop_last)
        collate = self.collate_fn or (default_collate if self.batched else default_convert)
        _set(self, kind=kind, collate=collate, timeout=float(self.timeout))
        for name in ("drop_last", "in_order", "pin_memory", "persistent_workers"):
            _set(self, **{name: bool(getattr(self, name))})
        _set(self, seed_per_sample=bool(self.seed_per_sample))
        _set(self, batch_fetch=self._fetches_batches())

    def _resolve_auto(self, kind: SourceKind) -> None:
        """The engine's worker count, then each ``"auto"`` setting's start and its flag, then
        the memory budget that bounds the auto settings (which needs one of them)."""
        if self.engine is not None:
            check_engine(self.engine, self.num_workers, self.executor)
            _set(self, num_workers=self.engine.num_workers, fetch_in_workers=True)
        if is_auto("num_workers", self.num_workers):
            loop_fed = not (kind is SourceKind.MAP or self.fetch_in_workers) and (
                self.transform is None and self.collate_fn is None
            )
            _set(self, num_workers=start_workers(loop_fed), auto_workers=True)
        check_num_workers(self.num_workers)
        if is_auto("io_concurrency", self.io_concurrency):
            _set(self, io_concurrency=AUTO_CAP, auto_io=True)
        check_int("io_concurrency", self.io_concurrency, 1)
        if is_auto("prefetch", self.prefetch):
            _set(self, prefetch=PREFETCH_START, auto_prefetch=True)
        check_int("prefetch", self.prefetch, 1)
        auto = self.auto_io or self.auto_workers or self.auto_prefetch
        if self.memory_budget is not None:
            check_int("memory_budget", self.memory_budget, 1)
            if not auto:
                raise ValueError(
                    'memory_budget= bounds the "auto" settings (io_concurrency, num_workers, '
                    "prefetch); it needs one of them"
                )
        elif auto:
            _set(self, memory_budget=DEFAULT_BUDGET)

    def _check_plain(self) -> None:
        """Checks the settings that depend on no other (and the workers' combination)."""
        check_int("fetch_threads", self.fetch_threads, 1)
        check_instance("pin_memory_device", self.pin_memory_device, str, "a str")
        check_timeout(self.timeout)
        stall_dump = stall_dump_seconds(os.environ.get(STALL_DUMP_ENV))
        _set(self, stall_dump=stall_dump)
        check_on_error(self.on_error, self.max_skipped)
        for name in ("collate_fn", "transform", "worker_init_fn", "device_transform"):
            check_callable(name, getattr(self, name))
        check_workers(self.num_workers, self.executor, self.persistent_workers, self.auto_workers)
        check_fetch_in_workers(self.fetch_in_workers, self.num_workers)
        check_instance("generator", self.generator, torch.Generator, "a torch.Generator")
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)

    def _fetches_batches(self) -> bool:
        """:attr:`batch_fetch`: DataLoader's rule (a ``__getitems__`` and automatic batching),
        for a sync map-style source, unless every sample is seeded on its own."""
        if self.kind is not SourceKind.MAP or not self.batched or self.seed_per_sample:
            return False
        return has_getitems(self.dataset)

    def _resolve_ranks(self, kind: SourceKind) -> None:
        """Checks the multi-rank options. Rank and world size not given are torch.distributed's
        at each epoch's start (so a loader built before ``init_process_group`` is right)."""
        _set(self, distributed=bool(self.distributed))
        if not self.distributed:
            for name in ("rank", "world_size"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}= needs distributed=True")
            return
        if self.distributed_tail not in TAILS:
            raise ValueError(
                f"distributed_tail must be 'pad' or 'drop', got {self.distributed_tail!r}"
            )
        for name, minimum in (("rank", 0), ("world_size", 1)):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum)
        if self.rank is not None or self.world_size is not None:
            resolve_ranks(self.rank, self.world_size)  # checks them; else resolved each epoch

    def _sample_map(self) -> None:
        """Checks the sampling options of a map-style source and builds its sampler chain."""
        if supplies_sampler(self.dataset):
            self._sample_by_dataset()
            return
        check_map_sampling(
            self.batch_size, self.shuffle, self.sampler, self.batch_sampler, self.drop_last
        )
        if self.batch_sampler is not None:
            _set(self, batch_size=None, drop_last=False)
        sampler = self.sampler
        if self.distributed and sampler is None and self.batch_sampler is None:
            sampler = RankSampler(
                len(self.dataset),
                rank=self.rank,
                world_size=self.world_size,
                shuffle=bool(self.shuffle),
                seed=self.generator.initial_seed() if self.generator is not None else 0,
                tail=self.distributed_tail,
            )
            _set(self, sampler=sampler)
        elif sampler is None:
            sampler = (
                RandomSampler(self.dataset, generator=self.generator)
                if self.shuffle
                else SequentialSampler(self.dataset)
            )
            _set(self, sampler=sampler)
        if self.batch_sampler is None and self.batch_size is not None:
            _set(self, batch_sampler=BatchSampler(sampler, self.batch_size, self.drop_last))

    def _sample_by_dataset(self) -> None:
        """A dataset that supplies its sampler (``loader_sampler()``): that sampler, batched
        by ``batch_size`` and ``drop_last``; it orders, shuffles and splits the dataset itself,
        so ``shuffle=True``, ``sampler`` and ``batch_sampler`` are refused."""
        options = (("shuffle", self.shuffle or None), ("sampler", self.sampler),
                   ("batch_sampler", self.batch_sampler))  # fmt: skip
        given = [name for name, value in options if value is not None]
        if given:
            raise ValueError(
                f"{given[0]}= with a dataset that supplies its own sampler "
                f"({type(self.dataset).__qualname__}.loader_sampler(): it orders and shuffles "
                f"the dataset, and splits it across ranks): leave {given[0]} unset"
            )
        check_auto_batching(self.batch_size, self.drop_last)
        sampler = self.dataset.loader_sampler()
        _set(self, sampler=sampler)
        if self.batch_size is not None:
            _set(self, batch_sampler=BatchSampler(sampler, self.batch_size, self.drop_last))

    def for_epoch(self, num_workers: int) -> Options:
        """These options with ``num_workers`` workers: an epoch's under ``num_workers="auto"``
        (validated already: the count only moves between 0 and the cores, and from 0 only
        where the workers would not run ``__getitem__``)."""
        if num_workers == self.num_workers:
            return self
        epoch = copy.copy(self)
        _set(epoch, num_workers=num_workers)
        return epoch

    def with_worker_init_fn(self, fn: Callable[[int], None] | None) -> Options:
        """These options with another ``worker_init_fn`` (DataLoader lets it be set)."""
        check_callable("worker_init_fn", fn)
        changed = copy.copy(self)
        _set(changed, worker_init_fn=fn)
        return changed

    @property
    def own_sampler(self) -> RankSampler | None:
        """The loader's own sampler of ``distributed=True`` (None with the user's)."""
        return self.sampler if isinstance(self.sampler, RankSampler) else None

    @property
    def batched(self) -> bool:
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def workers_fetch(self) -> bool:
        """The dataset goes to the workers: with ``fetch_in_workers``, or a sync map-style
        source with workers (its ``__getitem__`` runs there, as under DataLoader)."""
        return self.fetch_in_workers or (self.kind is SourceKind.MAP and self.num_workers > 0)

    @property
    def engine_fetches(self) -> bool:
        """The engine calls the dataset itself (its plan holds it): the workers
        (:attr:`workers_fetch`), or without workers the loader's ``fetch_threads`` for a
        :attr:`batch_fetch` source, each making whole batches (``__getitems__``, transform,
        collate) as a worker does. Not into a user's ``executor``, where the dataset would
        travel with every batch: its calls then stay in this process's fetch threads."""
        if self.workers_fetch:
            return True
        return self.batch_fetch and self.num_workers == 0 and self.executor is None

    @property
    def engine_width(self) -> int:
        """Batches the engine makes at once: one per worker; without workers one (the
        ``asyncloader-transform`` thread, or a user's executor), or ``fetch_threads`` when
        those threads make whole batches (:attr:`engine_fetches`)."""
        if self.num_workers:
            return self.num_workers
        return self.fetch_threads if self.engine_fetches else 1

    @property
    def worker_streams(self) -> bool:
        """Each worker iterates its own copy of an iterable source (``fetch_in_workers``)."""
        return self.fetch_in_workers and not self.kind.is_map

    @property
    def io_cap(self) -> int:
        """``io_concurrency`` once built: always an int (``"auto"`` became the cap)."""
        return cast("int", self.io_concurrency)

    @property
    def fetch_concurrency(self) -> int:
        """Samples at most being fetched at once (across the workers with
        ``fetch_in_workers``): a sync ``__getitem__`` runs in ``fetch_threads`` threads (one
        call at a time by default) of this process, or of each worker. With
        :attr:`batch_fetch`, calls at once, each a whole batch."""
        if self.kind is SourceKind.MAP:
            threads = self.fetch_threads * (self.num_workers if self.fetch_in_workers else 1)
            return min(self.io_cap, threads)
        return self.io_cap

    @property
    def prefetch_bound(self) -> int:
        """The highest ``prefetch`` may go: ``PREFETCH_CAP`` under ``prefetch="auto"``."""
        return PREFETCH_CAP if self.auto_prefetch else self.prefetch

    @property
    def transform_window(self) -> int:
        """Batches at most in the executor at once for transform: ``prefetch`` per worker (per
        thread of :attr:`engine_width`; at its bound)."""
        return self.transform_window_for(self.prefetch_bound)

    def transform_window_for(self, prefetch: int) -> int:
        return prefetch * self.engine_width

    @property
    def fetch_window(self) -> int:
        """Batches at most being fetched (on the loop, or in the workers with
        ``fetch_in_workers``): enough to keep io_concurrency busy."""
        return self.fetch_window_for(self.fetch_concurrency)

    def fetch_window_for(self, fetching: int) -> int:
        """The fetch window that keeps ``fetching`` samples busy."""
        if self.worker_streams or (self.engine_fetches and not self.fetch_in_workers):
            return 0
        if not self.kind.is_map:
            return 1
        if self.batch_fetch:  # one call per batch
            return fetching
        per_batch = self.batch_size or 1
        if self.batch_sampler is not None and self.batch_size is None:
            per_batch = getattr(self.batch_sampler, "batch_size", None) or 1
        return math.ceil(fetching / per_batch)

    @property
    def engine_window(self) -> int:
        """Batches at most in the engine: the transform window, and with
        ``fetch_in_workers`` the fetch window too (the workers fetch them)."""
        return self.engine_window_for(self.prefetch_bound)

    def engine_window_for(self, prefetch: int) -> int:
        """The engine's window at ``prefetch`` (``prefetch="auto"`` moves it)."""
        fetching = self.fetch_window if self.fetch_in_workers else 0
        return self.transform_window_for(prefetch) + fetching

    @property
    def device_stage(self) -> bool:
        """Batches go through the ``asyncloader-device`` thread (to pin, copy or transform)."""
        return (
            self.device is not None
            or self.device_transform is not None
            or (self.pin_memory and torch.cuda.is_available())
        )

    @property
    def device_depth(self) -> int:
        """Batches at most pinned or copied ahead of the consumer by the device thread."""
        return DEVICE_DEPTH if self.device_stage else 0

    @property
    def window(self) -> int:
        """Batches at most taken from the sampler and not yet handed to the consumer (under
        ``io_concurrency="auto"``, room for twice the highest limit: see ``_tuning.io_limit``; under
        ``prefetch="auto"``, at ``PREFETCH_CAP``)."""
        return self.window_for(self.fetch_room, self.prefetch_bound)

    @property
    def fetch_room(self) -> int:
        """Samples the window makes room for at most: the fetch concurrency, twice it under
        ``io_concurrency="auto"`` (a fetch held back by its limit has samples queued; no
        limit moves with :attr:`batch_fetch`)."""
        return self.fetch_concurrency * (2 if self.auto_io and not self.batch_fetch else 1)

    def window_for(self, fetching: int, prefetch: int) -> int:
        """The window that keeps ``fetching`` samples busy with ``prefetch`` batches per
        worker (the "auto" settings move both); never above :attr:`window`."""
        transform = self.transform_window_for(prefetch)
        return transform + self.fetch_window_for(fetching) + self.device_depth


def _set(options: Options, **values: Any) -> None:
    """Completes a frozen Options in ``__post_init__`` (the only place it changes)."""
    for name, value in values.items():
        object.__setattr__(options, name, value)
