"""Parquet and JSON Lines files for the tests: rows whose ``id`` tells them apart."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Sequence
from typing import Any


def rows(first: int, n: int) -> list[dict[str, Any]]:
    """Rows ``first .. first + n - 1``: an int id, a string, a token list (of 1 to 4), a
    pair, a float, a bool and a value that is null every seventh row."""
    return [
        {
            "id": i,
            "text": f"row {i} " + "word " * (i % 5),
            "tokens": [i % 11] * (1 + i % 4),
            "pair": [i, -i],
            "score": i / 4,
            "flag": i % 2 == 0,
            "maybe": None if i % 7 == 0 else i,
        }
        for i in range(first, first + n)
    ]


def parquet_bytes(table_rows: Sequence[dict[str, Any]], row_group_size: int) -> bytes:
    """A Parquet file of ``table_rows`` with row groups of ``row_group_size``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(list(table_rows)), out, row_group_size=row_group_size)
    return out.getvalue()


def parquet_set(sizes: Sequence[int], row_group_size: int) -> dict[str, bytes]:
    """Files ``part-<k>.parquet`` holding ``sizes[k]`` rows each, ids counted across them."""
    files, first = {}, 0
    for k, n in enumerate(sizes):
        files[f"part-{k}.parquet"] = parquet_bytes(rows(first, n), row_group_size)
        first += n
    return files


def jsonl_bytes(table_rows: Sequence[dict[str, Any]], compression: str | None = None) -> bytes:
    """``table_rows`` as JSON Lines, plain, ``"gz"`` or ``"zst"``."""
    data = "".join(json.dumps(row) + "\n" for row in table_rows).encode()
    if compression == "gz":
        return gzip.compress(data)
    if compression == "zst":
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    return data
