"""DataLoader's warning for an iterable source that yields more than its ``len()`` said."""

from __future__ import annotations

import dataclasses
from typing import Any

from asyncloader._base import warn_at_caller


@dataclasses.dataclass(frozen=True, slots=True)
class ReportedLength:
    """What ``len(loader)`` answered for an iterable source: its ``len()`` and in batches."""

    samples: int
    batches: int


class LengthCheck:
    """Counts the batches one epoch hands to the consumer and warns for each past the length
    ``len(loader)`` reported before the epoch began, as DataLoader does (and only then: a
    loader whose length nobody asked for never warns). The usual cause is an
    ``IterableDataset`` copied into each worker without splitting its items by
    ``get_worker_info()``, which yields ``num_workers`` times its length."""

    __slots__ = ("_dataset", "_in_workers", "_name", "_reported", "_unit", "_yielded")

    def __init__(
        self, reported: ReportedLength, dataset: Any, batched: bool, in_workers: bool, name: str
    ) -> None:
        """``batched``: batches hold more than one sample (the count is of batches then)."""
        self._reported = reported
        self._dataset = dataset
        self._unit = "batches" if batched else "samples"
        self._in_workers = in_workers
        self._name = name
        self._yielded = 0

    def handed_over(self) -> None:
        """One more batch reached the consumer."""
        self._yielded += 1
        if self._yielded <= self._reported.batches:
            return
        reported = self._reported
        in_batches = f", {reported.batches} batches" if self._unit == "batches" else ""
        message = (
            f"Length of IterableDataset {self._dataset} was reported to be {reported.samples} "
            f"(when accessing len({self._name}){in_batches}), but {self._yielded} {self._unit} "
            "have been fetched."
        )
        if self._in_workers:
            message += (
                " For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker: split its items by "
                "get_worker_info() (see torch.utils.data.IterableDataset)."
            )
        warn_at_caller(message)
