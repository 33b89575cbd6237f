"""Blocks of Parquet rows: a batch built from the Arrow columns is the batch default_collate
makes of the rows, a block the fast path cannot build is collated as rows, and taking
blocks off the stream gives the same rows in the same order as taking them one at a time."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from asyncloader import AsyncLoader
from asyncloader._base import TAKE
from asyncloader.sources import ParquetSource
from asyncloader.sources._columnar.arrow_rows import ArrowRows
from tests.helpers.columnar import parquet_bytes, rows

N = 50


def same(a: Any, b: Any) -> bool:
    """Equal values, dtypes, shapes and container types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def chunked(table: pa.Table) -> pa.Table:
    """``table`` split into three chunks per column, as a block joined from slices is."""
    third = table.num_rows // 3
    parts = [table.slice(0, third), table.slice(third, third), table.slice(2 * third)]
    return pa.concat_tables(parts)


SUPPORTED = {
    **{
        kind: pa.array(list(range(-5, N - 5)) if kind.startswith("int") else list(range(N)), kind)
        for kind in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
    },
    "float32": pa.array([i / 3 for i in range(N)], pa.float32()),
    "float64": pa.array([i / 3 for i in range(N)], pa.float64()),
    "bool": pa.array([i % 3 == 0 for i in range(N)]),
    "string": pa.array([f"s{i}" for i in range(N)]),
    "large_string": pa.array([f"é{i}" for i in range(N)], pa.large_string()),
    "binary": pa.array([bytes([i]) for i in range(N)], pa.binary()),
    "dict_string": pa.array([f"c{i % 4}" for i in range(N)]).dictionary_encode(),
    "dict_int": pa.array([i % 4 for i in range(N)], pa.int16()).dictionary_encode(),
    "list_int32": pa.array([[i, -i, 7] for i in range(N)], pa.list_(pa.int32())),
    "large_list_int64": pa.array([[i] for i in range(N)], pa.large_list(pa.int64())),
    "fixed_list_float32": pa.array([[i / 2, 1.0] for i in range(N)], pa.list_(pa.float32(), 2)),
    "list_bool": pa.array([[i % 2 == 0, True] for i in range(N)], pa.list_(pa.bool_())),
}


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_a_supported_column_is_built_as_default_collate_builds_its_rows(name):
    table = chunked(pa.table({name: SUPPORTED[name], "id": pa.array(range(N))}))
    block = ArrowRows(table)
    built = block.collated()
    assert built is not None
    assert same(built, default_collate(block.rows()))


def test_the_batch_owns_its_memory():
    block = ArrowRows(pa.table({"x": pa.array(range(N), pa.int64())}))
    built = block.collated()
    assert built is not None
    built["x"].add_(1)  # writable, and not the Arrow buffer's
    assert block.rows()[0] == {"x": 0}


UNSUPPORTED = {
    "nulls": pa.array([None if i % 7 == 0 else i for i in range(N)]),
    "uint64": pa.array(range(N), pa.uint64()),
    "float16": pa.array([1.5] * N, pa.float16()),
    "unequal_lists": pa.array([[i] * (1 + i % 3) for i in range(N)]),
    "list_of_strings": pa.array([["a", str(i)] for i in range(N)]),
    "list_with_a_null": pa.array([[i, None if i == 3 else i] for i in range(N)]),
    "struct": pa.array([{"a": i} for i in range(N)]),
    "timestamp": pa.array([i for i in range(N)], pa.timestamp("s")),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_any_other_column_leaves_the_block_to_be_collated_as_rows(name):
    block = ArrowRows(pa.table({"id": pa.array(range(N)), name: UNSUPPORTED[name]}))
    assert block.collated() is None


def test_slices_concat_and_pickle_keep_the_rows():
    table = pa.Table.from_pylist(rows(0, N))
    block = ArrowRows(table)
    parts = [block.slice(0, 7), block.slice(7, 7), block.slice(7, 30), block.slice(30, N)]
    assert [len(p) for p in parts] == [7, 0, 23, 20]
    joined = ArrowRows.concat(parts)
    assert joined.rows() == rows(0, N)
    assert pickle.loads(pickle.dumps(joined)).rows() == rows(0, N)


@pytest.fixture
def files(tmp_path):
    """Three files, row groups of 6, 7 and 8 rows: batches span row groups and files."""
    paths, first = [], 0
    for k, (n, group) in enumerate([(23, 6), (40, 7), (17, 8)]):
        path = tmp_path / f"part-{k}.parquet"
        path.write_bytes(parquet_bytes(rows(first, n), group))
        paths.append(str(path))
        first += n
    return paths


def expected_rows(files, columns=None):
    return [row for path in files for row in pq.read_table(path, columns=columns).to_pylist()]


@pytest.mark.parametrize("batch_size", [1, 5, 16, 100])
def test_taken_blocks_give_the_rows_one_at_a_time_would(files, batch_size):
    """Blocks taken off the stream, with single rows taken between them, make up the same
    rows in the same order."""

    async def run() -> list:
        it = aiter(ParquetSource(files))
        out: list = []
        while True:
            block = await getattr(it, TAKE)(batch_size)
            out.extend(block.rows() if isinstance(block, ArrowRows) else block)
            try:
                out.append(await anext(it))
            except StopAsyncIteration:
                return out

    assert asyncio.run(run()) == expected_rows(files)


COLUMNS = ["id", "text", "score", "flag"]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_workers": 2},
        {"num_workers": 2, "fetch_in_workers": True},
        {"drop_last": True},
    ],
    ids=["loop", "workers", "fetch_in_workers", "drop_last"],
)
def test_loader_batches_equal_dataloaders(files, options):
    """Built from the columns (COLUMNS), or from the rows where a column is a list: each
    batch is default_collate of its rows, and (where the training process makes the batches
    in order) the same batches as DataLoader's."""
    for columns in (COLUMNS, [*COLUMNS, "pair"]):
        source_rows = expected_rows(files, columns)
        by_id = {row["id"]: row for row in source_rows}
        ours = list(AsyncLoader(ParquetSource(files, columns=columns), batch_size=9, **options))
        for batch in ours:
            assert same(batch, default_collate([by_id[i] for i in batch["id"].tolist()]))
        got = sorted(i for batch in ours for i in batch["id"].tolist())
        if options.get("drop_last"):
            assert got == list(range(len(source_rows) // 9 * 9))
        else:
            assert got == sorted(by_id)
        if "fetch_in_workers" not in options:
            drop = options.get("drop_last", False)
            reference = DataLoader(source_rows, batch_size=9, drop_last=drop)
            assert all(same(a, b) for a, b in zip(ours, reference, strict=True))


def test_a_user_collate_gets_the_rows(files):
    ours = list(AsyncLoader(ParquetSource(files), batch_size=9, collate_fn=list))
    assert [row for batch in ours for row in batch] == expected_rows(files)
    assert all(type(batch) is list and len(batch) == 9 for batch in ours[:-1])


def test_a_transform_gets_each_row(files):
    loader = AsyncLoader(
        ParquetSource(files, columns=["id"]), batch_size=9, transform=lambda row: row["id"] * 2
    )
    assert torch.cat(list(loader)).tolist() == [2 * i for i in range(80)]


def test_supported_columns_make_no_row_objects(files, monkeypatch):
    """With the default collate and only supported columns, no block is made into rows."""

    def refused(self):
        raise AssertionError("rows made")

    monkeypatch.setattr(ArrowRows, "rows", refused)
    ours = list(AsyncLoader(ParquetSource(files, columns=COLUMNS), batch_size=9))
    assert torch.cat([b["id"] for b in ours]).tolist() == list(range(80))
