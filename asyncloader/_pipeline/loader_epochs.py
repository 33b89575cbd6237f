"""What a loader decides between its epochs: how many batches an epoch has (``len(loader)``)
and the options of the epoch about to start (``num_workers="auto"`` moves its count)."""

from __future__ import annotations

from asyncloader._config import Options
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.length import ReportedLength
from asyncloader._tuning import WorkerTuner, diagnose


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
