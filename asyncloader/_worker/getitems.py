"""``__getitems__``: a sync map-style source that reads a whole batch in one call.

DataLoader calls ``dataset.__getitems__(indices)`` once per batch, instead of ``__getitem__``
once per index, when the dataset has one and batches are collated automatically
(``batch_size`` or ``batch_sampler`` set): ``_MapDatasetFetcher.fetch`` in
``torch/utils/data/_utils/fetch.py``, checked against torch 2.13. Hugging Face
``datasets.Dataset`` defines it (a list of dicts), and so do torch's ``Subset`` and
``StackDataset``. asyncloader calls it wherever it would call a sync ``__getitem__``
(:attr:`~asyncloader._config.options.Options.batch_fetch` says when):

- fused with transform and collate in :func:`asyncloader._worker.plan.run_batch`: in a worker
  process (``num_workers > 0``; ``fetch_in_workers=True`` with one fetch thread, on its compute
  thread), and without workers in the loader's ``fetch_threads``, which then make whole
  batches as a worker would (``Options.engine_fetches``): one thread hop per batch, and the
  event loop never touches a sample;
- by a :class:`BatchFetcher` in fetch threads, one call per batch, where something else
  transforms and collates: a user's ``executor`` (``num_workers=0``: the dataset never travels
  to it), or a fetching worker's compute thread (``fetch_threads > 1``).

What it returns goes to ``collate_fn`` as it is, as under DataLoader. With a ``transform`` or
``on_error="skip"`` each sample is handled on its own, so it must be one sample per index (a
list, as torch's ``Dataset`` documents; another sequence is turned into one).

``on_error="skip"``: a batch whose ``__getitems__`` raises is fetched again one sample at a
time, with ``__getitem__``; the samples that raise are left out. When none does, the error was
not any sample's: the batch fails with it, as a ``collate_fn`` error does.

``seed_per_sample=True`` seeds the global RNGs before each sample, which one call for the whole
batch cannot honour: ``__getitems__`` is then not used, each sample's ``__getitem__`` is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from asyncloader._base import Failure, Skip, Trimmed
from asyncloader._tuning import EpochMeter, now


def getitems(dataset: Any, indices: Sequence[Any], aligned: bool) -> Any:
    """The samples of one batch, in one ``__getitems__`` call.

    Args:
        aligned: Each sample is handled on its own afterwards (a transform, or skipping):
            the result must hold one sample per index, and is made a list.

    Raises:
        ValueError: ``aligned`` and not one sample per index.
    """
    samples = dataset.__getitems__(indices)
    if not aligned:
        return samples
    if type(samples) is not list:
        samples = list(samples)
    if len(samples) != len(indices):
        raise ValueError(
            f"{type(dataset).__qualname__}.__getitems__ returned {len(samples)} samples for "
            f"{len(indices)} indices; with transform= or on_error='skip' it must return one "
            f"sample per index (a list, as torch's Dataset documents)"
        )
    return samples


def getitems_skipping(
    dataset: Any, seq: int, indices: Sequence[Any]
) -> tuple[list[tuple[Any, Any]], list[Skip]]:
    """Batch ``seq``'s samples under ``on_error="skip"``: in one call, or sample by sample
    when that call raises.

    Returns:
        ``(kept, skips)``: ``(index, sample)`` of each sample kept, and a :class:`Skip` for
        each sample whose ``__getitem__`` raised.

    Raises:
        Exception: ``__getitems__``'s error, when no sample's ``__getitem__`` raised (noted).
    """
    try:
        return list(zip(indices, getitems(dataset, indices, True), strict=True)), []
    except Exception as exc:
        batch_error = exc
    kept, skips = [], []
    getitem = dataset.__getitem__
    for index in indices:
        try:
            kept.append((index, getitem(index)))
        except Exception as exc:
            skips.append(Skip.capture(exc, "fetch", seq, indices, index))
    if not skips:
        batch_error.add_note(
            "asyncloader: on_error='skip' fetched the batch again one sample at a time and no "
            "sample's __getitem__ raised: the batch fails"
        )
        raise batch_error
    return kept, skips


class BatchFetcher:
    """Fetches each batch with one ``__getitems__`` call in ``threads``, a pool of ``limit``
    threads: at most ``limit`` calls run at once (``fetching <= limit``).

    Every batch is handed to the pool as soon as it is asked for (the epoch's window bounds
    how many are), so a thread goes from one call straight to the next without waiting for
    the event loop to hear of the last one: the loop and the consumer hold the GIL between
    calls only briefly, never while a thread sits idle.

    It stands where a :class:`~asyncloader._worker.fetch.Fetcher` would (``fetch_then_run`` and the
    epoch use either): :meth:`fetch` gives the samples, a Failure, or with ``skip`` a Trimmed.

    Liveness: each :meth:`fetch` is one job in ``threads``, which runs queued jobs as threads
    free; its future completes with the samples or a Failure (:meth:`_call` captures the
    source's errors), and the pool is shut down only after the epoch's tasks ended.

    Args:
        dataset: The sync map-style source.
        threads: Where the calls run, ``limit`` threads (never the event loop's thread).
        limit: The threads of ``threads``.
        skip: ``on_error="skip"`` (see :func:`getitems_skipping`).
        aligned: A transform follows (see :func:`getitems`).
        meter: Told each call's duration (``fetch``: one per batch here, not per sample).
    """

    def __init__(
        self,
        dataset: Any,
        threads: Executor,
        limit: int,
        skip: bool,
        aligned: bool,
        meter: EpochMeter | None = None,
    ) -> None:
        self._dataset = dataset
        self._threads = threads
        self._skip, self._aligned = skip, aligned or skip
        self._meter = meter
        self._lock = threading.Lock()  # the counts below change in the threads
        self.limit = limit
        self.fetching = 0
        self.max_fetching = 0

    async def fetch(self, seq: int, indices: Sequence[Any]) -> Any:
        """Batch ``seq``'s samples (or a Failure naming it, or a Trimmed with ``skip``)."""
        if not indices:
            return []
        loop = asyncio.get_running_loop()
        result, seconds = await loop.run_in_executor(self._threads, self._timed, seq, indices)
        if self._meter is not None:
            self._meter.fetch.add(seconds)
        return result

    def close(self) -> None:
        """No more batches will come (nothing waits on it: for the Fetcher's interface)."""

    def _timed(self, seq: int, indices: Sequence[Any]) -> tuple[Any, float]:
        """In a fetch thread: :meth:`_call`, counted and timed."""
        with self._lock:
            self.fetching += 1
            self.max_fetching = max(self.max_fetching, self.fetching)
        began = now()
        try:
            return self._call(seq, indices), now() - began
        finally:
            with self._lock:
                self.fetching -= 1

    def _call(self, seq: int, indices: Sequence[Any]) -> Any:
        """The batch's samples, or what stands for them."""
        try:
            if not self._skip:
                return getitems(self._dataset, indices, self._aligned)
            kept, skips = getitems_skipping(self._dataset, seq, indices)
        except Exception as exc:
            return Failure.capture(exc, "fetch", seq, indices)
        samples = [sample for _, sample in kept]
        if not skips:
            return samples
        kept_indices = [index for index, _ in kept]
        return Trimmed(samples, skips, empty=not kept, indices=kept_indices)
