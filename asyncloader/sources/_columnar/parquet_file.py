"""A Parquet file read as ranges: its footer, the byte ranges of a row group's column chunks,
and that row group decoded from those ranges alone.

Nothing here does IO: :mod:`.parquet` fetches the ranges these functions name and hands the
bytes back. Every size a footer claims is checked against the file's size and the caps
before anything is fetched or allocated, so a corrupt or hostile footer is a ``Permanent``
error naming what it claimed, never a huge read.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from asyncloader.sources._retry import Permanent

MAGIC = b"PAR1"
#: The first read of a file: its last TAIL bytes, which hold the whole footer of most files
#: (a larger footer costs a second request; a larger guess, bytes of data not asked for).
TAIL = 8 << 10
#: Column chunks closer than this are fetched as one range (as Arrow's own reader does).
GAP = 8 << 10


def import_pyarrow() -> Any:
    """``pyarrow.parquet``, or ImportError saying which extra installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is in the dev extras
        raise ImportError(
            "ParquetSource needs pyarrow: pip install 'asyncloader[parquet]'"
        ) from exc
    return pq


def footer_span(tail: bytes, size: int, limit: int | None) -> tuple[int, int]:
    """``(start, length)`` of the footer (its length field and magic included) of a file of
    ``size`` bytes whose last bytes are ``tail``.

    Raises:
        Permanent: Not a Parquet file, truncated, or a footer over ``limit`` bytes.
    """
    if size < 12 or len(tail) < 8 or tail[-4:] != MAGIC:
        raise Permanent(f"not a Parquet file: its {size} bytes do not end with {MAGIC!r}")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise Permanent(f"a truncated Parquet file: its footer claims {length} of {size} bytes")
    if limit is not None and length > limit:
        raise Permanent(f"its Parquet footer claims {length} bytes, over max_object_size={limit}")
    return size - length - 8, length + 8


def parse_footer(footer: bytes) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of a footer (its length field and magic
    included).

    Raises:
        Permanent: The footer does not parse.
    """
    pq = import_pyarrow()
    import pyarrow as pa

    try:  # the footer after a magic is a file without row groups' bytes, as pyarrow reads it
        return pq.read_metadata(pa.BufferReader(MAGIC + footer))
    except Exception as exc:
        raise Permanent(f"a corrupt Parquet footer: {type(exc).__name__}: {exc}") from None


def leaf_columns(meta: Any, columns: Sequence[str] | None) -> list[int]:
    """The leaf columns (indices) that make up top-level ``columns`` (None: all).

    Raises:
        ValueError: A column the file does not have.
    """
    names = [meta.schema.column(j).path.split(".")[0] for j in range(meta.num_columns)]
    if columns is None:
        return list(range(meta.num_columns))
    missing = sorted(set(columns) - set(names))
    if missing:
        raise ValueError(f"columns {missing} are not in the file, which has {sorted(set(names))}")
    wanted = set(columns)
    return [j for j, name in enumerate(names) if name in wanted]


def chunk_ranges(meta: Any, row_group: int, leaves: Sequence[int], size: int) -> list[range]:
    """The byte ranges holding ``leaves``' chunks of ``row_group``, neighbours closer than
    ``GAP`` joined, in file order.

    Raises:
        Permanent: A chunk the footer places outside the file's data.
    """
    group = meta.row_group(row_group)
    data_end = size - 8  # the footer's start is not known here; its magic and length are not data
    spans = []
    for j in leaves:
        col = group.column(j)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            start = min(start, col.dictionary_page_offset)
        end = start + col.total_compressed_size
        if start < 4 or col.total_compressed_size < 0 or end > data_end:
            raise Permanent(
                f"a corrupt Parquet footer: row group {row_group}'s column {col.path_in_schema} "
                f"claims bytes {start}-{end} of a {size}-byte file"
            )
        spans.append((start, end))
    joined: list[list[int]] = []
    for start, end in sorted(spans):
        if joined and start - joined[-1][1] <= GAP:
            joined[-1][1] = max(joined[-1][1], end)
        else:
            joined.append([start, end])
    return [range(start, end) for start, end in joined]


def decode_rows(
    meta: Any,
    size: int,
    parts: Sequence[tuple[int, bytes]],
    row_group: int,
    columns: Sequence[str] | None,
    rows: range,
) -> Any:
    """Rows ``rows`` of ``row_group`` as a ``pyarrow.Table``, decoded from ``parts``
    (``(offset, bytes)`` of the file) alone. Blocking (pyarrow releases the GIL while it
    decompresses and decodes): run it off the event loop.

    Raises:
        Permanent: The bytes do not decode (a corrupt file), or hold fewer rows than the
            footer says.
    """
    pq = import_pyarrow()
    try:
        reader = pq.ParquetFile(SparseFile(size, parts), metadata=meta, pre_buffer=False)
        table = reader.read_row_group(row_group, columns=None if columns is None else list(columns))
    except Permanent:
        raise
    except Exception as exc:
        raise Permanent(f"a corrupt Parquet row group: {type(exc).__name__}: {exc}") from None
    if table.num_rows < rows.stop:
        raise Permanent(f"the row group holds fewer rows than its footer says ({table.num_rows})")
    return table.slice(rows.start, len(rows))


class SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``parts`` (``(offset, bytes)``) are
    known: what pyarrow reads a row group through. Reading anywhere else raises
    ``Permanent`` (the footer pointed outside the ranges it named)."""

    def __init__(self, size: int, parts: Sequence[tuple[int, bytes]]) -> None:
        super().__init__()
        self._size = size
        self._parts = sorted(parts, key=lambda part: part[0])
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        for offset, data in self._parts:
            if offset <= self._pos and self._pos + want <= offset + len(data):
                at = self._pos - offset
                memoryview(buffer)[:want] = data[at : at + want]
                self._pos += want
                return want
        raise Permanent(
            f"a corrupt Parquet file: a read of bytes {self._pos}-{self._pos + want} outside "
            "the ranges its footer names"
        )
