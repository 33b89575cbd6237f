"""ParquetSource: rows as pyarrow gives them, batches as DataLoader collates them, only the
selected column chunks fetched, one version per file, and clear errors.

The loader-level contracts (order, exactly once, bounded window, clean shutdown, resume at
every position, workers) run over it in tests/integration/test_contracts.py."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from asyncloader import AsyncLoader
from asyncloader.errors import FetchError
from asyncloader.sources import DiskCache, ParquetSource, Retry
from asyncloader.sources._columnar.parquet_file import TAIL, chunk_ranges, footer_span
from asyncloader.sources._retry import Permanent
from tests.helpers.columnar import parquet_bytes, parquet_set, rows
from tests.servers import Faults

FAST = Retry(attempts=4, backoff=0.001, max_backoff=0.01)
SIZES, GROUP = [23, 40, 17], 6  # 80 rows; row groups of 6 (4 + 7 + 3 of them)
TOTAL = sum(SIZES)


@pytest.fixture
def files(tmp_path):
    paths = []
    for name, data in parquet_set(SIZES, GROUP).items():
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
    return [str(p) for p in paths]


def stream(source) -> list:
    async def run():
        return [row async for row in source]

    return asyncio.run(run())


def test_rows_are_pyarrows_rows_in_file_order(files):
    """Unshuffled, the rows are the files' rows in order, as pyarrow's to_pylist gives them
    (nulls, lists, floats and bools included)."""
    expected = [row for path in files for row in pq.read_table(path).to_pylist()]
    assert stream(ParquetSource(files)) == expected
    assert [r["id"] for r in expected] == list(range(TOTAL))


def test_columns_select_and_a_missing_column_is_named(files):
    got = stream(ParquetSource(files, columns=["id", "tokens"]))
    assert got == [{"id": r["id"], "tokens": r["tokens"]} for r in rows(0, TOTAL)]
    with pytest.raises(ValueError, match=re.escape("columns ['nope'] are not in the file")):
        stream(ParquetSource(files, columns=["id", "nope"]))
    with pytest.raises(ValueError, match="columns must be"):
        ParquetSource(files, columns="id")


def test_batches_equal_dataloaders_collate_and_none_yields_rows(files):
    """The default collate batches rows as DataLoader's does; batch_size=None: single rows."""
    columns = ["id", "text", "pair", "score", "flag"]  # default_collate refuses None
    reference = list(DataLoader(stream(ParquetSource(files, columns=columns)), batch_size=7))
    ours = list(AsyncLoader(ParquetSource(files, columns=columns), batch_size=7))
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference, strict=True):
        assert a.keys() == b.keys()
        assert torch.equal(a["id"], b["id"]) and a["id"].dtype == b["id"].dtype
        assert torch.equal(a["score"], b["score"]) and torch.equal(a["flag"], b["flag"])
        assert a["text"] == b["text"]
        assert [t.tolist() for t in a["pair"]] == [t.tolist() for t in b["pair"]]
    singles = list(AsyncLoader(ParquetSource(files, columns=["id"]), batch_size=None))
    assert singles == [{"id": i} for i in range(TOTAL)]


def test_len_reads_the_footers(files):
    assert len(ParquetSource(files)) == TOTAL
    assert len(ParquetSource(files, rank=1, world_size=3)) == TOTAL // 3


def test_shuffle_is_seeded_by_seed_and_epoch(files):
    def order(seed: int, epoch: int) -> list[int]:
        source = ParquetSource(files, shuffle=True, seed=seed, shuffle_buffer=10)
        source.set_epoch(epoch)
        return [row["id"] for row in stream(source)]

    first = order(1, 0)
    assert sorted(first) == list(range(TOTAL)) and first != list(range(TOTAL))
    assert order(1, 0) == first
    assert order(1, 1) != first and order(2, 0) != first


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_ranks_split_the_rows_into_equal_shares(files, tail):
    shares = [
        [r["id"] for r in stream(ParquetSource(files, rank=k, world_size=3, distributed_tail=tail))]
        for k in range(3)
    ]
    per = TOTAL // 3 if tail == "drop" else -(-TOTAL // 3)
    assert [len(s) for s in shares] == [per] * 3
    every = [i for s in shares for i in s]
    if tail == "drop":
        assert len(set(every)) == len(every) and len(every) == TOTAL - TOTAL % 3
    else:
        assert set(every) == set(range(TOTAL))


def test_source_state_resumes_exactly(files):
    """state_dict() after k rows, loaded into a fresh source: the rest of the epoch follows."""

    async def run():
        reference = [r["id"] async for r in make()]
        for k in (0, 5, 31, TOTAL - 1):
            first = make()
            it = aiter(first)
            seen = [(await anext(it))["id"] for _ in range(k)]
            state = first.state_dict()
            await it.aclose()
            second = make()
            second.load_state_dict(state)
            rest = [r["id"] async for r in second]
            assert seen + rest == reference, k

    def make():
        return ParquetSource(files, shuffle=True, seed=4, shuffle_buffer=9, columns=["id"])

    asyncio.run(run())


def big_files(n_files: int = 2) -> dict[str, bytes]:
    """Files whose column chunks are large beside a footer."""
    return {f"big-{k}.parquet": parquet_bytes(rows(k * 4000, 4000), 1000) for k in range(n_files)}


def requested_bytes(requests, sizes: dict[str, int]) -> int:
    total = 0
    for request in requests:
        path = request.path.lstrip("/")
        first, _, last = request.range.removeprefix("bytes=").partition("-")
        if not first:  # a suffix: the last `last` bytes
            total += min(int(last), sizes[path])
        else:
            total += int(last) + 1 - int(first)
    return total


def test_only_the_selected_chunks_and_the_footers_are_fetched(http_server):
    """columns=["id"]: the bytes asked for are the id chunks and the footers, within 10%
    beyond the first read of each file's tail."""
    objects = big_files()
    server = http_server(objects)
    urls = [server.url(name) for name in objects]
    assert [r["id"] for r in stream(ParquetSource(urls, columns=["id"]))] == list(range(8000))
    needed, tails = 0, 0
    for data in objects.values():
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
        _, length = footer_span(data[-8:], len(data), None)
        needed += length + sum(
            len(r)
            for g in range(meta.num_row_groups)
            for r in chunk_ranges(meta, g, [0], len(data))
        )
        tails += TAIL
    sizes = {name: len(data) for name, data in objects.items()}
    assert all(r.range for r in server.requests), "a request without a Range"
    assert requested_bytes(server.requests, sizes) <= 1.1 * needed + tails


def test_transient_failures_are_retried(http_server):
    objects = big_files(1)
    (name,) = objects
    server = http_server(objects, Faults(script={name: ["503", "ok", "reset", "503"]}))
    source = ParquetSource([server.url(name)], columns=["id"], retry=FAST)
    assert [r["id"] for r in stream(source)] == list(range(4000))


def test_a_file_rewritten_while_read_is_an_error_not_a_splice(http_server):
    objects = big_files(1)
    (name,) = objects
    server = http_server(objects)
    source = ParquetSource([server.url(name)], columns=["id"], retry=FAST)

    async def run():
        await source.count_samples()
        server.objects[name] = parquet_bytes(rows(9, 4000), 1000)  # same shape, new bytes
        return [r async for r in source]

    with pytest.raises(FetchError, match="changed while it was read") as caught:
        asyncio.run(run())
    assert name in caught.value.target


@pytest.mark.parametrize(
    "bad, says",
    [
        (b"not parquet at all" * 100, "not a Parquet file"),
        (b"PAR1" + b"\0" * 100 + (2**31 - 1).to_bytes(4, "little") + b"PAR1", "truncated"),
    ],
    ids=["not-parquet", "footer-claims-too-much"],
)
def test_a_file_that_is_not_parquet_is_a_fetch_error_naming_it(tmp_path, files, bad, says):
    path = tmp_path / "bad.parquet"
    path.write_bytes(bad)
    with pytest.raises(FetchError, match=says) as caught:
        stream(ParquetSource([files[0], str(path)]))
    assert caught.value.target.endswith("bad.parquet")


def test_a_truncated_file_is_a_fetch_error(tmp_path, files):
    data = Path(files[1]).read_bytes()
    path = tmp_path / "cut.parquet"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FetchError, match="not a Parquet file"):
        stream(ParquetSource([str(path)]))


def corrupt_row_group(tmp_path, group: int) -> str:
    """A copy of a 4-row-group file whose row group ``group`` has its chunks overwritten."""
    data = bytearray(parquet_bytes(rows(0, 40), 10))
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    for r in chunk_ranges(meta, group, range(meta.num_columns), len(data)):
        data[r.start : r.stop] = b"\xff" * len(r)
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(bytes(data))
    return str(path)


def test_a_corrupt_row_group_names_it_and_can_be_skipped(tmp_path):
    path = corrupt_row_group(tmp_path, 2)
    with pytest.raises(FetchError, match="corrupt") as caught:
        stream(ParquetSource([path]))
    assert caught.value.target.endswith("corrupt.parquet#row_group=2")
    source = ParquetSource([path], on_error="skip", max_skipped=10)
    ids = [r["id"] for r in stream(source)]
    assert ids == [i for i in range(40) if not 20 <= i < 30]
    assert source.skipped == 10 and "row_group=2" in source.skip_log[0]


def test_a_footer_placing_a_chunk_outside_the_file_is_refused():
    column = SimpleNamespace(
        data_page_offset=4,
        dictionary_page_offset=None,
        has_dictionary_page=False,
        total_compressed_size=10**12,
        path_in_schema="id",
    )
    meta = SimpleNamespace(row_group=lambda g: SimpleNamespace(column=lambda j: column))
    with pytest.raises(Permanent, match="claims bytes 4-"):
        chunk_ranges(meta, 0, [0], 1000)
    with pytest.raises(Permanent, match="over max_object_size"):
        footer_span(b"x" * 4 + (500).to_bytes(4, "little") + b"PAR1", 10_000, 100)


def test_disk_cache_serves_a_second_epoch(http_server, tmp_path):
    objects = big_files(1)
    server = http_server(objects)
    cache = DiskCache(tmp_path / "cache", max_bytes=1 << 30)
    source = ParquetSource([server.url(n) for n in objects], columns=["id"], cache=cache)
    assert [r["id"] for r in stream(source)] == list(range(4000))
    asked = len(server.requests)
    again = ParquetSource([server.url(n) for n in objects], columns=["id"], cache=cache)
    assert [r["id"] for r in stream(again)] == list(range(4000))
    assert len(server.requests) == asked, "the second epoch went to the server"


def test_resume_at_another_world_size_delivers_each_row_at_most_once(files):
    """Two ranks stop after 11 rows each; three ranks continue from either's state: every
    row comes at most once overall, and all but fewer than 3 + 2 (the two splits' tails)."""

    async def run():
        seen, state = [], None
        for rank in range(2):
            source = ParquetSource(files, shuffle=True, seed=2, rank=rank, world_size=2)
            it = aiter(source)
            seen += [(await anext(it))["id"] for _ in range(11)]
            state = source.state_dict()
            await it.aclose()
        for rank in range(3):
            source = ParquetSource(files, shuffle=True, seed=2, rank=rank, world_size=3)
            source.load_state_dict(state)
            seen += [row["id"] async for row in source]
        return seen

    seen = asyncio.run(run())
    assert len(seen) == len(set(seen)), "a row came twice"
    assert TOTAL - 5 < len(seen) <= TOTAL


@pytest.mark.parametrize("workers", [{}, {"num_workers": 2, "fetch_in_workers": True}])
def test_unshuffled_loader_resumes_exactly(files, workers):
    """The default (unshuffled: row groups in file order, read ahead of their turn), resumed
    through the loader's state after k batches: the batches that follow are the same."""
    from tests.helpers.contracts import check_resume

    def make():
        return AsyncLoader(ParquetSource(files, columns=["id"]), batch_size=7, **workers)

    points = (0, 3, 11) if workers else None
    check_resume(make, points, key=lambda batch: batch["id"].tolist())


# -- filter --------------------------------------------------------------------------------

#: Keeps 33 of the 80 rows; the statistics of the first file's first two row groups (score
#: at most 3.0) rule them out.
KEEP = (pc.field("score") > 3.0) & pc.field("flag")


def kept(files, columns=None) -> list[dict]:
    """What pyarrow itself reads of ``files`` under KEEP."""
    return [
        r for path in files for r in pq.read_table(path, filters=KEEP, columns=columns).to_pylist()
    ]


def test_a_filter_yields_the_rows_pyarrow_keeps_without_reading_ruled_out_row_groups(
    http_server,
):
    """The rows are pyarrow's under the same filter (its columns need not be selected); row
    groups the statistics rule out are not fetched, and the count pass reads only the
    filter's columns."""
    objects = big_files()
    server = http_server(objects)
    urls = [server.url(name) for name in objects]
    where = pc.field("id") >= 6000  # the second file's last two row groups
    got = stream(ParquetSource(urls, columns=["text"], filter=where))
    expected = pq.read_table(io.BytesIO(objects["big-1.parquet"]), filters=where)
    assert got == expected.select(["text"]).to_pylist()
    first = [r for r in server.requests if r.path.endswith("big-0.parquet")]
    assert all(r.range.startswith("bytes=-") for r in first), "a ruled-out row group was read"
    meta = pq.ParquetFile(io.BytesIO(objects["big-1.parquet"])).metadata
    size = len(objects["big-1.parquet"])
    out = [r for g in (0, 1) for r in chunk_ranges(meta, g, range(meta.num_columns), size)]
    lo, hi = min(r.start for r in out), max(r.stop for r in out)  # the ruled-out groups
    for request in server.requests:
        first_byte, _, last = request.range.removeprefix("bytes=").partition("-")
        if request.path.endswith("big-1.parquet") and first_byte:
            assert int(last) < lo or int(first_byte) >= hi, request.range


def test_a_filter_keeps_order_ranks_and_len(files):
    every = [r["id"] for r in kept(files)]
    assert (
        len(every) == 33 and [r["id"] for r in stream(ParquetSource(files, filter=KEEP))] == every
    )
    assert stream(ParquetSource(files, columns=["id"], filter=KEEP)) == kept(files, ["id"])
    assert len(ParquetSource(files, filter=KEEP)) == 33
    shares = [
        [r["id"] for r in stream(ParquetSource(files, filter=KEEP, rank=k, world_size=2))]
        for k in range(2)
    ]
    assert [len(s) for s in shares] == [16, 16] and set(shares[0]) | set(shares[1]) < set(every)
    assert not set(shares[0]) & set(shares[1])


@pytest.mark.parametrize("workers", [{}, {"num_workers": 2, "fetch_in_workers": True}])
def test_a_filtered_loader_resumes_exactly(files, workers):
    from tests.helpers.contracts import check_resume

    def make():
        source = ParquetSource(files, columns=["id"], filter=KEEP, shuffle=True, seed=2)
        return AsyncLoader(source, batch_size=4, **workers)

    check_resume(make, (0, 2, 5) if workers else None, key=lambda batch: batch["id"].tolist())


def test_a_filter_is_checked():
    with pytest.raises(TypeError, match="filter must be a pyarrow expression"):
        ParquetSource(["a.parquet"], filter="score > 3")


def test_a_filter_naming_a_column_the_files_lack_is_named(files):
    with pytest.raises(ValueError, match=r"filter \(nope > 1\) does not apply to the files"):
        stream(ParquetSource(files, filter=pc.field("nope") > 1))


def test_a_row_group_keeping_other_than_its_count_is_an_error_naming_it(files):
    """Rows kept that differ from the count the epoch was split by (a filter that does not
    decide the same way twice) fail the row group, never shift the epoch."""
    source = ParquetSource(files, filter=KEEP)
    asyncio.run(source.count_samples())
    source._counts[0] += 1
    with pytest.raises(FetchError, match=r"#row_group=\d+.*the filter kept 2 rows, 3 when"):
        stream(source)
