"""What the executor does to one batch: fetch, transform and collate, calling the user's code.

The work unit is a batch, so per-task overhead (IPC, pickling) is paid once per batch. In
asyncloader's own process pool the :class:`BatchPlan` (dataset, transform, collate) reaches
each worker once, through the pool's initializer; tasks then carry only ``(seq, indices)`` or
the raw samples fetched on the event loop. With a user executor or without workers the plan
travels with each task instead (by reference in threads, pickled for a foreign process pool).
A batch made in a worker process leaves it through :func:`leave_worker`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data import default_collate

from asyncloader._base import (
    Failure,
    RowBlock,
    Samples,
    Seeds,
    Skip,
    Trimmed,
    call_seeded,
    get_worker_info,
    tracing,
)
from asyncloader._worker.buffers import settle
from asyncloader._worker.collate import collate_small, worker_collate
from asyncloader._worker.columns import ColumnReader, reads_columns
from asyncloader._worker.getitems import getitems, getitems_skipping
from asyncloader._worker.process_state import init_failure, mark_running, shares_batches
from asyncloader._worker.transport import by_value, to_shared

if TYPE_CHECKING:
    from asyncloader._config import Options


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What the executor does to one batch.

    Attributes:
        dataset: Set when the executor fetches samples itself (sync map-style source).
        transform: Applied to every sample, or ``None``.
        collate: Turns the list of samples into the batch (or converts one sample when not
            batching).
        batched: ``False`` for ``batch_size=None``: each batch is a single sample.
        skip: ``on_error="skip"``: a sample whose fetch or transform raises is left out of its
            batch (see :func:`_run`).
        getitems: The dataset's ``__getitems__`` fetches each batch in one call
            (:mod:`asyncloader._worker.getitems`).
        buffers: Shared-memory batch segments each worker process may keep for reuse, at
            most (:mod:`asyncloader._worker.buffers`; 0: none).
        columns: Reads a ``datasets.Dataset``'s batches as columns where that is the batch
            DataLoader makes (:mod:`asyncloader._worker.columns`); ``None``: never.
    """

    dataset: Any
    transform: Callable[[Any], Any] | None
    collate: Callable[[Any], Any]
    batched: bool
    skip: bool = False
    getitems: bool = False
    buffers: int = 0
    columns: ColumnReader | None = None

    @classmethod
    def of(cls, options: Options) -> BatchPlan:
        """What the executor does to each batch of a loader with ``options``."""
        return cls(
            dataset=options.dataset if options.engine_fetches else None,
            transform=options.transform,
            collate=options.collate,
            batched=options.batched,
            skip=options.on_error == "skip",
            getitems=options.batch_fetch,
            # One worker may hold every batch of the window (the others slow), +2: the one
            # the consumer holds and one it let go that is not lent again yet. A bound only:
            # a pool holds what is in use at once, as fresh segments would (docs/workers.md).
            buffers=options.window + 2,
            columns=ColumnReader() if _by_columns(options) else None,
        )

    def sent(self, worker_init_fn: Any) -> dict[str, Any]:
        """What a worker process holding this plan receives, by the loader argument's name."""
        return {
            "dataset": self.dataset,
            "transform": self.transform,
            "collate_fn": self.collate,
            "worker_init_fn": worker_init_fn,
        }


_plan: BatchPlan | None = None  # the plan this worker process was started with


def keep_plan(plan: BatchPlan) -> None:
    """This worker process runs every batch by ``plan`` (its start-up sends it once)."""
    global _plan
    _plan = plan


def _by_columns(options: Options) -> bool:
    """Whole ``__getitems__`` batches, as they come, collated by ``default_collate``, of a
    dataset whose batch that is the same as its columns (:mod:`asyncloader._worker.columns`)."""
    return (
        options.batch_fetch
        and options.engine_fetches
        and options.collate is default_collate
        and options.transform is None
        and options.on_error != "skip"
        and reads_columns(options.dataset)
    )


def leave_worker(batch: Any) -> Any:
    """``batch`` ready to leave this process: through shared memory from a worker of this
    machine's pool (naming the reused segments it holds: :mod:`asyncloader._worker.buffers`);
    by value from a Ray actor (numpy arrays travel out of band there, where a tensor is
    pickled whole by ``torch.save``); as it is anywhere else."""
    if shares_batches():
        return settle(to_shared(batch))
    if get_worker_info() is not None:
        return by_value(batch)
    return batch


def run_batch_traced(
    trace: bool,
    seq: int,
    indices: Sequence[Any],
    samples: Samples | None,
    seeds: Seeds | None = None,
) -> Any:
    """:func:`run_batch` in a pool's worker (which holds its plan), recorded while the
    training process traces (``trace``): then answered with the events (a ``Traced``)."""
    tracing.worker_recording(trace, _worker_name)
    return tracing.with_events(run_batch(None, seq, indices, samples, seeds))


def _worker_name() -> str:
    info = get_worker_info()
    return f"worker {info.id}" if info is not None else f"worker pid {os.getpid()}"


def run_batch(
    plan: BatchPlan | None,
    seq: int,
    indices: Sequence[Any],
    samples: Samples | None,
    seeds: Seeds | None = None,
) -> Any:
    """Fetches (when ``samples`` is None: one ``__getitems__`` call with ``plan.getitems``,
    else ``__getitem__`` per index), transforms and collates one batch.

    Args:
        plan: What to do, or ``None`` in a worker that holds its plan already.
        seeds: How to seed the global RNGs first (:class:`~asyncloader._base.seeding.Seeds`): in a
            worker process from ``(epoch seed, seq)`` once; with ``per_sample`` from
            ``(epoch seed, index)`` before each sample's ``__getitem__`` and ``transform``
            and from ``(epoch seed, seq)`` before collate. Either way the batch is the same
            whichever worker makes it.

    Returns:
        The batch (ready to leave the process, in a worker process), or a :class:`Failure`
        naming the stage and sample that raised.
    """
    if (failed := init_failure()) is not None:
        return failed
    plan = plan if plan is not None else _plan
    assert plan is not None, "run_batch without a plan outside an initialised worker"
    mark_running(seq)
    try:
        epoch_seed = None
        if seeds is not None:
            seeds.seed_batch(seq)
            epoch_seed = seeds.sample_seeds
        return _run(plan, seq, indices, samples, epoch_seed)
    finally:
        mark_running(-1)


def _run(
    plan: BatchPlan,
    seq: int,
    indices: Sequence[Any],
    samples: Samples | None,
    epoch_seed: int | None,
) -> Any:
    """:func:`run_batch` once seeded, skipping or not.

    Under ``on_error="skip"`` a sample whose ``__getitem__`` or ``transform`` raises an
    ``Exception`` is left out; collate errors fail the batch (and a ``__getitems__`` error that
    no sample's ``__getitem__`` repeats: see
    :func:`~asyncloader._worker.getitems.getitems_skipping`). Without it the first error fails
    the batch. The path is the same: ``skips`` (``None`` when not skipping) is looked at once per
    stage, never per sample when not skipping.

    Returns:
        The batch; or the :class:`Failure` of the stage (and sample) that raised; or, when a
        sample was left out, a :class:`Trimmed` around the batch of the samples kept (or around
        the collate Failure, or empty when none was kept), with one :class:`Skip` per sample
        left out.
    """
    skips: list[Skip] | None = [] if plan.skip else None
    if isinstance(samples, RowBlock):
        batch = _collate_block(plan, seq, indices, samples)
        if batch is not _NOT_COLUMNS:
            return batch
        samples = samples.rows()
    if samples is None and plan.columns is not None:
        batch = _read_columns(plan, seq, indices)
        if batch is not _NOT_COLUMNS:
            return batch
    made = _fetched_and_transformed(plan, seq, indices, samples, epoch_seed, skips)
    if isinstance(made, Failure):
        return made
    if skips is not None and not made:
        return Trimmed(None, skips, empty=True)
    stage = "collate"
    try:
        collate = worker_collate(plan.collate)
        with tracing.span("collate", seq):
            batch = call_seeded(epoch_seed, -1 - seq, collate, made if plan.batched else made[0])
        stage = "share"
        batch = _left(batch, seq)
    except Exception as exc:
        batch = Failure.capture(exc, stage, seq, indices)
    return Trimmed(batch, skips) if skips else batch


def _fetched_and_transformed(
    plan: BatchPlan,
    seq: int,
    indices: Sequence[Any],
    samples: Sequence[Any] | None,
    epoch_seed: int | None,
    skips: list[Skip] | None,
) -> Failure | Sequence[Any]:
    """Batch ``seq``'s samples fetched (unless given) and transformed (where the plan has a
    transform), those ``skips`` records left out; or the :class:`Failure` of the stage."""
    keys: Sequence[Any] = indices
    if samples is None:
        with tracing.span("fetch", seq, len(indices)):
            fetched = _fetch(plan, seq, indices, epoch_seed, skips)
        if isinstance(fetched, Failure):
            return fetched
        keys, samples = fetched
    if plan.transform is not None:
        with tracing.span("transform", seq):
            done = _each(
                "transform", plan.transform, seq, indices, keys, samples, epoch_seed, skips
            )
        if isinstance(done, Failure):
            return done
        keys, samples = done
    return samples


_NOT_COLUMNS = object()  # what _read_columns returns for a batch it does not read


def _read_columns(plan: BatchPlan, seq: int, indices: Sequence[Any]) -> Any:
    """The batch read as columns by ``plan.columns`` (never set with ``on_error="skip"``),
    ready to leave the process, or its :class:`Failure`; ``_NOT_COLUMNS`` where it is not one
    the reader makes."""
    columns = plan.columns
    assert columns is not None
    return _made_here(lambda: columns.read(plan.dataset, indices), "fetch", seq, indices)


def _collate_block(plan: BatchPlan, seq: int, indices: Sequence[Any], block: RowBlock) -> Any:
    """The batch of a block of rows built from its columns (``block.collated()``) where the
    plan would only ``default_collate`` its rows, ready to leave the process, or its
    :class:`Failure`; ``_NOT_COLUMNS`` where the rows are to be collated instead."""
    if (
        plan.transform is not None
        or plan.skip
        or not plan.batched
        or plan.collate not in (default_collate, collate_small)
    ):
        return _NOT_COLUMNS
    return _made_here(block.collated, "collate", seq, indices)


def _left(batch: Any, seq: int) -> Any:
    """:func:`leave_worker`, as the slice where batch ``seq``'s arrow to its delivery starts."""
    with tracing.span("share", seq):
        tracing.flow("s", seq)
        return leave_worker(batch)


def _made_here(make: Callable[[], Any], stage: str, seq: int, indices: Sequence[Any]) -> Any:
    """``make()``'s batch ready to leave the process; ``_NOT_COLUMNS`` where it made none
    (``None``); or the :class:`Failure` of ``stage`` (or of ``"share"``)."""
    try:
        with tracing.span(stage, seq):
            batch = make()
        if batch is None:
            return _NOT_COLUMNS
        stage = "share"
        return _left(batch, seq)
    except Exception as exc:
        return Failure.capture(exc, stage, seq, indices)


def _fetch(
    plan: BatchPlan,
    seq: int,
    indices: Sequence[Any],
    epoch_seed: int | None,
    skips: list[Skip] | None,
) -> tuple[Sequence[Any], list[Any]] | Failure:
    """The samples of one batch and the indices they belong to (``indices`` itself unless
    ``skips`` took some out), or the :class:`Failure` of the fetch."""
    if plan.getitems:
        try:
            if skips is None:
                return indices, getitems(plan.dataset, indices, plan.transform is not None)
            kept, left_out = getitems_skipping(plan.dataset, seq, indices)
        except Exception as exc:
            return Failure.capture(exc, "fetch", seq, indices)
        skips.extend(left_out)
        return [index for index, _ in kept], [sample for _, sample in kept]
    getitem = plan.dataset.__getitem__
    return _each("fetch", getitem, seq, indices, indices, None, epoch_seed, skips)


def _each(
    stage: str,
    fn: Callable[[Any], Any],
    seq: int,
    indices: Sequence[Any],
    keys: Sequence[Any],
    values: Sequence[Any] | None,
    epoch_seed: int | None,
    skips: list[Skip] | None,
) -> tuple[Sequence[Any], list[Any]] | Failure:
    """``fn`` over ``values`` one sample at a time, seeded by each one's index in ``keys``
    (``values`` ``None``: over the indices themselves, a fetch): the indices kept and their
    results.

    Without ``skips`` the first error returns the :class:`Failure` of that sample, and the loop
    does no more per sample than the call; with ``skips`` a sample that raises is left out,
    recorded there.
    """
    if skips is None:
        out, index = [], None
        try:
            if values is None:
                for index in keys:
                    out.append(call_seeded(epoch_seed, index, fn, index))
            else:
                for index, value in zip(keys, values, strict=False):
                    out.append(call_seeded(epoch_seed, index, fn, value))
        except Exception as exc:
            return Failure.capture(exc, stage, seq, indices, index)
        return keys, out
    kept, out = [], []
    for index, value in zip(keys, keys if values is None else values, strict=True):
        try:
            out.append(call_seeded(epoch_seed, index, fn, value))
        except Exception as exc:
            skips.append(Skip.capture(exc, stage, seq, indices, index))
        else:
            kept.append(index)
    return kept, out
