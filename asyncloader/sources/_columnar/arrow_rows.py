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
======================================  ===============================================

A block with any other column (nulls, uint64, float16, lists, structs, dates, ...) is not
built so: its rows are collated, errors included, as DataLoader would collate them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArrowRows, (self.table,))

    def rows(self) -> list[Any]:
        rows: list[Any] = self.table.to_pylist()
        return rows

    def slice(self, start: int, stop: int) -> ArrowRows:
        return ArrowRows(self.table.slice(start, stop - start))

    @classmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> ArrowRows:
        import pyarrow as pa

        return ArrowRows(pa.concat_tables([b.table for b in blocks]))  # type: ignore[attr-defined]

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
            batch[name] = column.to_pylist() if kind == "text" else _tensor(column, kind)
        return batch


def _kind(column: Any) -> str | None:
    """How ``column`` becomes its batch: ``"int"``, ``"float"``, ``"bool"`` (a tensor) or
    ``"text"`` (a list); ``None`` where it is not built from the column."""
    if column.null_count:
        return None
    kind = column.type
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


def _tensor(column: Any, kind: str) -> torch.Tensor:
    """``column``'s values in a tensor of ``kind``'s dtype that owns its memory."""
    out = torch.empty(len(column), dtype=_DTYPES[kind])
    view = out.numpy()
    at = 0
    for chunk in column.chunks:
        if str(chunk.type).startswith("dictionary"):
            chunk = chunk.dictionary_decode()
        view[at : at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        at += len(chunk)
    return out
