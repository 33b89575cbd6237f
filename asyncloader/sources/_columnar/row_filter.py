"""A ``ParquetSource`` filter: a pyarrow expression, decided per row group from the footer's
statistics where they can tell, then per row.

Exact under resume, ranks and workers because ``ParquetSource`` counts the rows a filter keeps
before the first iteration (reading the filter's own columns only, :meth:`RowFilter.columns`):
the shards and their counts are fixed by the files, as without a filter, and a row group's kept
rows are found again the same way wherever it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncloader.sources._columnar.parquet_file import SparseFile, import_pyarrow


class _FooterOnly(SparseFile):
    """A file of which only the footer (at its end) is known; bytes before it read as zeros.
    pyarrow reads a tail of 64 KiB to find the footer, and parses only the footer."""

    def __init__(self, size: int, footer: bytes) -> None:
        super().__init__(size, [(size - len(footer), footer)])
        self._start, self._footer = size - len(footer), footer

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0 or self._pos + want <= self._start:
            return super().readinto(buffer)  # not the tail: refused
        zeros = max(0, self._start - self._pos)
        view = memoryview(buffer)
        view[:zeros] = bytes(zeros)
        at = self._pos + zeros - self._start
        view[zeros:want] = self._footer[at : at + want - zeros]
        self._pos += want
        return want


class RowFilter:
    """``expression`` (a ``pyarrow.compute.Expression``) over the files of one schema.

    Raises:
        TypeError: ``expression`` is not a pyarrow expression.
    """

    def __init__(self, expression: Any) -> None:
        import_pyarrow()
        import pyarrow.compute as pc

        if not isinstance(expression, pc.Expression):
            raise TypeError(
                "filter must be a pyarrow expression (pyarrow.compute.field('lang') == 'en'), "
                f"got {type(expression).__name__}"
            )
        self.expression = expression
        self._columns: list[str] | None = None

    def columns(self, schema: Any) -> list[str]:
        """The top-level columns of ``schema`` (an Arrow schema) the expression reads: those
        without which it does not bind.

        Raises:
            ValueError: It names a column ``schema`` does not have, or does not bind to it.
        """
        if self._columns is None:
            empty = schema.empty_table()
            try:
                empty.filter(self.expression)
            except Exception as exc:
                why = f"filter {self.expression} does not apply to the files: {exc}"
                raise ValueError(why.splitlines()[0]) from None
            self._columns = [c for c in schema.names if not _binds(empty, c, self.expression)]
        return self._columns

    def row_groups(self, size: int, footer: bytes) -> list[int] | None:
        """The row groups of the file (``size`` bytes, ending with ``footer``) whose
        statistics do not rule the expression out; None where pyarrow cannot tell."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        try:
            file = pa.PythonFile(_FooterOnly(size, footer), mode="r")
            fragment = ds.ParquetFileFormat().make_fragment(file)
            kept = fragment.split_by_row_group(filter=self.expression)
            return sorted(group.id for part in kept for group in part.row_groups)
        except Exception:  # statistics it cannot read: every row group is read
            return None

    def decoded(self, schema: Any, columns: Sequence[str] | None) -> list[str] | None:
        """The columns to decode for ``columns`` (None: all) of files of ``schema``, to
        filter them: those and the expression's."""
        if columns is None:
            return None
        return list(dict.fromkeys([*columns, *self.columns(schema)]))

    def apply(self, table: Any, columns: Sequence[str] | None) -> Any:
        """The rows of ``table`` the expression keeps, with ``columns`` (None: all)."""
        kept = table.filter(self.expression)
        return kept if columns is None else kept.select(list(columns))


def _binds(empty: Any, column: str, expression: Any) -> bool:
    try:
        empty.drop_columns([column]).filter(expression)
    except Exception:
        return False
    return True


__all__ = ["RowFilter"]
