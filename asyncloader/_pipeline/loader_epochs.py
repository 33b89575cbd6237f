"""What a loader keeps and decides across its epochs (:class:`LoaderEpochs`): starting the
next one, how many batches an epoch has (``len(loader)``), the options of the epoch about
to start (``num_workers="auto"`` moves its count), its stats and its checkpoint state."""

from __future__ import annotations

import copy
import weakref
from collections import deque
from typing import Any, cast

from asyncloader._base import SKIP_LOG_LENGTH, keep_torch_threads
from asyncloader._config import Options
from asyncloader._engines import Workers
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.epoch_start import SamplerCursor, start_epoch, with_sampler
from asyncloader._pipeline.length import ReportedLength
from asyncloader._pipeline.loader_state import saved_state
from asyncloader._tuning import (
    FetchTuner,
    LoaderStats,
    PrefetchTuner,
    WorkerTuner,
    diagnose,
    now,
)


def batches_per_epoch(options: Options) -> tuple[int, ReportedLength | None]:
    """Batches per epoch, and for an iterable source what ``len(loader)`` reported (each batch
    an epoch begun afterwards yields past it warns, as DataLoader's iterators do).

    Raises:
        TypeError: The source has no length.
    """
    if options.kind.is_map:
        sampler = options.batch_sampler if options.batch_sampler is not None else options.sampler
        return len(sampler), None
    n = len(options.dataset)
    if options.batch_size is None:
        batches = n
    else:
        batches = n // options.batch_size if options.drop_last else -(-n // options.batch_size)
    return batches, ReportedLength(n, batches)


def next_epoch_options(options: Options, tuner: WorkerTuner | None, last: Epoch | None) -> Options:
    """The options of the epoch about to start: under ``num_workers="auto"`` (``tuner``), with
    the count the last epoch's measurements give (see :mod:`asyncloader._tuning.autosize`)."""
    if tuner is None:
        return options
    if last is not None and last.progress.finished:  # a broken-off epoch's rate says little
        stats = last.stats
        stage = diagnose(stats, last.options).stage
        tuner.epoch_ended(stats, stage, last.prefetch, stats.batch_bytes)
    return options.for_epoch(tuner.count)


class LoaderEpochs:
    """What a loader keeps across its epochs, and starting the next one.

    Invariants: ``number`` is the current (or last) epoch's, ``-1`` before the first;
    ``last`` is the newest epoch started and ``previous`` the stats of the one before it;
    ``resume`` is the state loaded and not yet started from (``None`` otherwise), kept
    until an epoch starts from it; the tuners of the ``"auto"`` options and ``skip_log``
    carry over from epoch to epoch. Nothing here is copied with the loader but ``number``
    and ``resume``.
    """

    def __init__(self, options: Options) -> None:
        self.running: weakref.WeakSet[Epoch] = weakref.WeakSet()
        self.last: Epoch | None = None
        self.previous: LoaderStats | None = None
        self.tuner = None  # io_concurrency="auto" on this process's loop: kept across epochs
        if options.auto_io and options.memory_budget is not None:
            self.tuner = FetchTuner(options.fetch_concurrency, options.memory_budget, now())
        budget = options.memory_budget or 0
        # num_workers="auto": the count between epochs (fixed where each worker iterates its
        # own copy of an iterable source: that copy's state goes on from epoch to epoch).
        self.worker_tuner = None
        if options.auto_workers and not options.worker_streams:
            self.worker_tuner = WorkerTuner(options.num_workers, budget)
        self.prefetch_tuner = PrefetchTuner(budget) if options.auto_prefetch else None
        self.number = -1
        self.resume: dict[str, Any] | None = None
        # Between epochs the dataset's own state is saved: a map-style one's, or an iterable's
        # whose __iter__ returned another object (one that is its own iterator is reset by it).
        self.dataset_keeps_state = options.kind.is_map
        self.skip_log: deque[tuple[Any, str]] = deque(maxlen=SKIP_LOG_LENGTH)
        self.reported_len: ReportedLength | None = None  # len(loader) of an iterable source

    def start(self, options: Options, workers: Workers) -> Epoch:
        """Starts the next epoch (or the resumed one) of a loader of ``options``, on the
        consumer's thread."""
        keep_torch_threads()  # on the consumer's thread, before the epoch starts any thread
        last = self.last
        if last is not None and last.took_every_batch():
            cast(SamplerCursor, last.start_info.index_iter).drain()  # its last draws first
        # A loaded state stays loaded until an epoch started from it: iter() failing on the
        # way (the source's own load_state_dict, say) leaves it for the next iter().
        # A copy each time: the source may keep (and change) what it loads.
        resume = copy.deepcopy(self.resume)
        options = next_epoch_options(options, self.worker_tuner, last)
        start = start_epoch(options, self.number + 1, resume)
        self.number = start.number
        if start.source_iter is not None:
            self.dataset_keeps_state = start.source_iter is not options.dataset
        lease = workers.lease(start.seed, options)
        start = with_sampler(options, start)  # after the fork: workers get no index list
        if last is not None:
            self.previous = last.stats
        self.last = Epoch(
            options,
            start,
            lease,
            self.skip_log,
            self.tuner,
            self.reported_len,
            self.prefetch_tuner,
        )
        self.running.add(self.last)
        self.resume = None
        return self.last

    def options(self, options: Options) -> Options:
        """The current (or last) epoch's options, else the loader's ``options``."""
        return self.last.options if self.last is not None else options

    def prefetch(self, options: Options) -> int:
        """``prefetch`` of the current (or last) epoch, else the first's."""
        if self.last is not None:
            return self.last.prefetch
        tuner = self.prefetch_tuner
        return tuner.prefetch if tuner is not None else options.prefetch

    def stats(self, options: Options) -> LoaderStats:
        """The current (or last) epoch's stats; before the first, empty ones."""
        if self.last is None:
            return LoaderStats(options.window, 0, options.fetch_concurrency, 0, 0)
        return self.last.stats

    def count_batches(self, options: Options) -> int:
        """``len(loader)``; for an iterable source, epochs begun from now on warn past it."""
        batches, reported = batches_per_epoch(options)
        if reported is not None:
            self.reported_len = reported
        return batches

    def state_dict(self, options: Options) -> dict[str, Any]:
        """The loaded state not yet started from, else what the consumer has received."""
        if self.resume is not None:
            return copy.deepcopy(self.resume)
        return saved_state(options, self.number, self.last, self.dataset_keeps_state)
