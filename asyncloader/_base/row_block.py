"""Consecutive rows of a source held as one object, and how a loader pulls them in blocks.

A source that holds its rows as columns (a decoded Parquet row group) can hand the loader a
batch's rows as one :class:`RowBlock` instead of one Python object per row. The loader then
makes the batch from the block: with torch's ``default_collate`` straight from the columns
(:meth:`RowBlock.collated`, where that gives the very batch ``default_collate`` would give of
the rows), else from :meth:`RowBlock.rows`, the rows as the source's ``__anext__`` yields
them. So a block never changes a batch, only what it costs.

The pull protocol: an async iterator may have ``__asyncloader_take__(n)``, a coroutine that
returns its next ``min(n, left)`` items, as a list or a :class:`RowBlock` (fewer than ``n``
only at its end), exactly the items ``n`` awaits of ``__anext__`` would have given.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

#: The name of the pull protocol's method.
TAKE = "__asyncloader_take__"


class RowBlock(abc.ABC):
    """Rows ``0 .. len(self)-1`` of a source, in order.

    Invariant: ``rows()`` returns ``len(self)`` rows, each equal to the row the source's
    ``__anext__`` would have yielded at that position; ``collated()`` is ``None`` or equals
    ``default_collate(rows())`` (values, dtypes, shapes and container types).
    """

    __slots__ = ()

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def rows(self) -> list[Any]:
        """The rows as Python objects."""

    @abc.abstractmethod
    def slice(self, start: int, stop: int) -> RowBlock:
        """Rows ``start .. stop-1`` (``0 <= start <= stop <= len(self)``) as a block."""

    @classmethod
    @abc.abstractmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> RowBlock | None:
        """The rows of ``blocks`` (all of this class) one after the other, as one block, or
        ``None`` where they cannot be one (then they are joined as rows)."""

    def collated(self) -> Any | None:
        """``default_collate(self.rows())`` made without a Python object per value, or
        ``None`` where this block cannot (then the rows are collated)."""
        return None


#: A batch's samples as pulled from a source: a list, or a block of rows.
Samples = list[Any] | RowBlock


def joined(pieces: Sequence[Samples]) -> Samples:
    """``pieces`` (blocks and lists of rows, in order) as one block where they are all blocks
    of one class, else as one list of rows."""
    if len(pieces) == 1:
        return pieces[0] if isinstance(pieces[0], RowBlock) else list(pieces[0])
    kinds = {type(p) for p in pieces}
    if len(kinds) == 1:
        (kind,) = kinds
        if issubclass(kind, RowBlock):
            block = kind.concat(pieces)  # type: ignore[arg-type]
            if block is not None:
                return block
    rows: list[Any] = []
    for piece in pieces:
        rows.extend(piece.rows() if isinstance(piece, RowBlock) else piece)
    return rows
