"""A Hugging Face ``datasets.Dataset`` in torch format, read a batch of columns at a time.

For such a dataset DataLoader's batch is ``default_collate(dataset.__getitems__(indices))``.
``datasets``' own ``__getitems__`` first reads ``dataset[indices]``, a dict of one tensor per
column holding every row of the batch, then splits it into a dict per row; ``default_collate``
then stacks those rows back into one tensor per column. Stacking row ``i`` of each column
gives the column itself (values, dtype, shape), and a list of strings collates to itself, so
where every column is one of those two, ``dataset[indices]`` is that batch: read without the
split and the re-stacking (for 391 batches of 256 rows of two small columns, 0.79-0.88 s
instead of 1.04-1.38 s: docs/benchmarks.md).

:class:`ColumnReader` reads batches so, only where the result is the same: the dataset is a
``datasets.Dataset`` whose ``__getitem__`` and ``__getitems__`` are ``datasets``' own, in
``"torch"`` format, batched with torch's ``default_collate``, without ``transform`` or
``on_error="skip"`` (:func:`reads_columns`, checked as each plan is made: an epoch's, a
worker pool's). A batch with any other column (a list of tensors of different lengths, ints
left unformatted by ``output_all_columns``, a nested dict) is read with ``__getitems__`` and
collated as DataLoader does, errors included, and so is every batch after it. A column
tensor that may share its memory with something else (``datasets`` made it from an array it
keeps) is copied, as ``torch.stack`` would have: the batch owns its memory. ``datasets`` is
never imported here; a dataset can only be one if its module was loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch


def reads_columns(dataset: Any) -> bool:
    """``dataset`` is a ``datasets.Dataset`` in torch format that reads rows with
    ``datasets``' own ``__getitem__`` and ``__getitems__``."""
    module = sys.modules.get("datasets")
    base = getattr(module, "Dataset", None)
    if not isinstance(base, type) or not isinstance(dataset, base):
        return False
    kind = type(dataset)
    for method in ("__getitem__", "__getitems__"):
        if getattr(kind, method, None) is not getattr(base, method, None):
            return False
    form = getattr(dataset, "format", None)
    return isinstance(form, dict) and form.get("type") == "torch"


def _owned(column: torch.Tensor) -> torch.Tensor:
    """``column`` where it alone owns its memory (contiguous, the whole of a storage torch
    allocated), else a contiguous copy."""
    storage = column.untyped_storage()
    if (
        column.is_contiguous()
        and column.storage_offset() == 0
        and storage.nbytes() == column.nbytes
        and storage.resizable()
    ):
        return column
    return column.clone(memory_format=torch.contiguous_format)


def column_batch(dataset: Any, indices: Sequence[Any]) -> dict[str, Any] | None:
    """``dataset[indices]`` where it equals ``default_collate(dataset.__getitems__(indices))``:
    every column a strided tensor of ``len(indices)`` rows or a list of that many strings.
    ``None`` otherwise (nothing is then returned of what was read)."""
    rows = len(indices)
    if not rows:
        return None
    batch = dataset[indices]
    if type(batch) is not dict or not batch:
        return None
    out: dict[str, Any] = {}
    for name, column in batch.items():
        if type(column) is torch.Tensor:
            if (
                column.dim() == 0
                or len(column) != rows
                or column.layout is not torch.strided
                or column.is_nested
            ):
                return None
            out[name] = _owned(column)
        elif type(column) is list and len(column) == rows and all(type(v) is str for v in column):
            out[name] = column
        else:
            return None
    return out


class ColumnReader:
    """Reads each batch with :func:`column_batch` until one cannot be: that batch and every
    later one go through ``__getitems__`` and the collate (``on`` is then False). One per
    plan; a worker process has its own copy."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True

    def read(self, dataset: Any, indices: Sequence[Any]) -> dict[str, Any] | None:
        """The batch of ``indices``, or ``None``: read it as DataLoader does."""
        if not self.on:
            return None
        batch = column_batch(dataset, indices)
        if batch is None:
            self.on = False
        return batch
