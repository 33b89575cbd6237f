"""Rows of a decoded Parquet row group as one block, and their batch built from the columns.

:class:`ArrowRows` is a :class:`~asyncloader._base.RowBlock` over a ``pyarrow.Table``: its
rows are ``table.to_pylist()``, and slicing and joining blocks copies no values. Where the
loader would only ``default_collate`` the rows, :meth:`ArrowRows.collated` builds the batch
from the columns instead, without a Python object per number:

======================================  ===============================================
column (no nulls)                       what ``default_collate`` makes of its values
======================================  ===============================================
int8-64, uint8-32                       ``torch.int64`` tensor
float32, float64                        ``torch.float64`` tensor (Python floats)
bool                                    ``torch.bool`` tensor
string, large_string, string_view       list of ``str``
binary, large_binary, binary_view       list of ``bytes``
dictionary of one of those              as its values
list of ints, floats or bools, every    a list with one tensor per position, as above
row of one length                       (``default_collate`` transposes equal lists)
======================================  ===============================================

A block with any other column (nulls, uint64, float16, lists of other values or of unequal
lengths, structs, dates, ...) is not built so: its rows are collated, errors included, as
DataLoader would collate them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from asyncloader._base import RowBlock

_INT = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
_FLOAT = ("float", "double")  # pyarrow's names of float32 and float64
_TEXT = ("string", "large_string", "string_view", "binary", "large_binary", "binary_view")


class ArrowRows(RowBlock):
    """The rows of ``table``, one dict per row (``table.to_pylist()``)."""

    __slots__ = ("table",)

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def rows(self) -> list[Any]:
        rows: list[Any] = self.table.to_pylist()
        return rows

    def slice(self, start: int, stop: int) -> ArrowRows:
        return ArrowRows(self.table.slice(start, stop - start))

    @classmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> ArrowRows | None:
        """One block, or ``None`` where the tables' schemas differ (files written apart, or
        JSON types inferred per block): promoting a type would change the rows' values."""
        import pyarrow as pa

        tables = [b.table for b in blocks]  # type: ignore[attr-defined]
        first = tables[0].schema
        if any(not t.schema.equals(first) for t in tables[1:]):
            return None
        return ArrowRows(pa.concat_tables(tables))

    def collated(self) -> dict[str, Any] | None:
        columns = self.table.columns
        kinds: list[str] = []
        for column in columns:
            kind = _kind(column)
            if kind is None:
                return None
            kinds.append(kind)
        batch: dict[str, Any] = {}
        for name, column, kind in zip(self.table.column_names, columns, kinds, strict=True):
            if kind == "text":
                batch[name] = column.to_pylist()
            elif kind.startswith("list "):
                per_position = _per_position(column, kind[5:])
                if per_position is None:
                    return None
                batch[name] = per_position
            else:
                batch[name] = _tensor(column, kind)
        return batch


def _kind(column: Any) -> str | None:
    """How ``column`` becomes its batch: ``"int"``, ``"float"``, ``"bool"`` (a tensor),
    ``"text"`` (a list) or ``"list <one of the tensor kinds>"``; ``None`` where it is not
    built from the column."""
    if column.null_count:
        return None
    kind = column.type
    if str(kind).startswith(_LISTS):
        inner = _scalar_kind(kind.value_type)
        return f"list {inner}" if inner in _DTYPES else None
    return _scalar_kind(kind)


def _scalar_kind(kind: Any) -> str | None:
    if str(kind).startswith("dictionary"):
        kind = kind.value_type
    name = str(kind)
    if name in _INT:
        return "int"
    if name in _FLOAT:
        return "float"
    if name == "bool":
        return "bool"
    if name in _TEXT:
        return "text"
    return None


_DTYPES = {"int": torch.int64, "float": torch.float64, "bool": torch.bool}
_LISTS = ("list<", "large_list<", "fixed_size_list<")


def _tensor(column: Any, kind: str) -> torch.Tensor:
    """``column``'s values in a tensor of ``kind``'s dtype that owns its memory."""
    out = torch.empty(len(column), dtype=_DTYPES[kind])
    view = out.numpy()
    at = 0
    for chunk in column.chunks:
        view[at : at + len(chunk)] = _values(chunk)
        at += len(chunk)
    return out


#: numpy's dtype of each primitive Arrow type the batches are built from.
_NUMPY = {
    **{name: np.dtype(name) for name in _INT},
    "float": np.dtype("float32"),
    "double": np.dtype("float64"),
    "bool": np.dtype("bool"),
}


def _values(array: Any) -> np.ndarray:
    """The values of a null-free primitive (or dictionary of primitive) Arrow array, read
    from its buffer. (``Array.to_numpy`` would import pandas, 0.4 s and its memory, in every
    process that builds a batch.)"""
    if str(array.type).startswith("dictionary"):
        decoded: np.ndarray = _values(array.dictionary)[_values(array.indices)]
        return decoded
    n, start = len(array), array.offset
    if not n:
        return np.empty(0, _NUMPY[str(array.type)])
    data = array.buffers()[1]
    if str(array.type) == "bool":
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        return bits[start : start + n].view(np.bool_)
    dtype = _NUMPY[str(array.type)]
    return np.frombuffer(data, dtype, count=n, offset=start * dtype.itemsize)


def _per_position(column: Any, kind: str) -> list[torch.Tensor] | None:
    """A list column as ``default_collate`` makes it of equal-length lists: one tensor per
    position, of that position's values across the rows (views of one buffer); ``None``
    where the lists' lengths differ or a value is null."""
    width: int | None = None
    parts = []
    for chunk in column.chunks:
        if not len(chunk):
            continue
        span = _span(chunk)
        if span is None or width not in (None, span[1]):
            return None
        start, width = span
        values = chunk.values.slice(start, len(chunk) * width)
        if values.null_count:
            return None
        parts.append(_values(values).reshape(len(chunk), width))
    if width is None or width == 0:
        return None
    out = torch.empty((width, len(column)), dtype=_DTYPES[kind])
    view, at = out.numpy(), 0
    for part in parts:
        view[:, at : at + len(part)] = part.T
        at += len(part)
    return list(out.unbind(0))


def _span(chunk: Any) -> tuple[int, int] | None:
    """Where a list array's values start in its child array, and the length of every list;
    ``None`` where the lengths differ."""
    if str(chunk.type).startswith("fixed_size_list<"):
        width = chunk.type.list_size
        return chunk.offset * width, width
    dtype = _NUMPY["int64" if str(chunk.type).startswith("large") else "int32"]
    ends = np.frombuffer(chunk.buffers()[1], dtype, len(chunk) + 1, chunk.offset * dtype.itemsize)
    lengths = np.diff(ends)
    if (lengths != lengths[0]).any():
        return None
    return int(ends[0]), int(lengths[0])
