"""JsonlSource: one dict per line, plain, gzip or zstd, decompressed as it streams; broken
streams resumed without losing or repeating a line; malformed lines named by file and line.

The loader-level contracts run over it in tests/integration/test_contracts.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc

import pytest
import zstandard

from asyncloader import AsyncLoader
from asyncloader.errors import FetchError
from asyncloader.sources import JsonlSource, Retry
from tests.helpers.columnar import jsonl_bytes, rows
from tests.servers import Faults

FAST = Retry(attempts=6, backoff=0.001, max_backoff=0.01)
SIZES = [30, 45, 25]
TOTAL = sum(SIZES)
SUFFIX = {None: ".jsonl", "gz": ".jsonl.gz", "zst": ".jsonl.zst"}


def file_set(compression: str | None) -> dict[str, bytes]:
    files, first = {}, 0
    for k, n in enumerate(SIZES):
        files[f"part-{k}{SUFFIX[compression]}"] = jsonl_bytes(rows(first, n), compression)
        first += n
    return files


def write(tmp_path, files: dict[str, bytes]) -> list[str]:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return [str(tmp_path / name) for name in files]


@pytest.fixture(params=["json", "arrow"])
def parse(request, monkeypatch):
    """Each way of parsing; pyarrow's in blocks of a few lines, so that blocks end mid-file."""
    monkeypatch.setattr("asyncloader.sources._columnar.jsonl.BLOCK_BYTES", 600)
    return request.param


def stream(source) -> list:
    async def run():
        return [row async for row in source]

    return asyncio.run(run())


@pytest.mark.parametrize("compression", [None, "gz", "zst"])
def test_lines_in_file_order(tmp_path, compression, parse):
    paths = write(tmp_path, file_set(compression))
    assert stream(JsonlSource(paths, parse=parse)) == rows(0, TOTAL)
    batches = list(AsyncLoader(JsonlSource(paths, parse=parse), batch_size=8, collate_fn=list))
    assert [r["id"] for b in batches for r in b] == list(range(TOTAL))


def test_blank_lines_crlf_and_a_last_line_without_newline(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n   \n{"a": 2}\n{"a": 3}')
    assert stream(JsonlSource([str(path)])) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_concatenated_members_and_frames(tmp_path):
    """Files written in pieces (gzip members, zstd frames) are read across the pieces."""
    first, second = jsonl_bytes(rows(0, 5)), jsonl_bytes(rows(5, 5))
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(first) + gzip.compress(second))
    zst = zstandard.ZstdCompressor()
    (tmp_path / "b.jsonl.zst").write_bytes(zst.compress(first) + zst.compress(second))
    for name in ("a.jsonl.gz", "b.jsonl.zst"):
        assert stream(JsonlSource([str(tmp_path / name)])) == rows(0, 10)


@pytest.mark.parametrize("compression", [None, "gz", "zst"])
def test_broken_streams_resume_without_loss_or_repeat(http_server, compression, parse):
    """Connections cut mid-file: a plain file resumes after its last whole line, a
    compressed one replays past the lines it gave; every line comes once, in order."""
    files = file_set(compression)
    script = {name: ["reset:300", "truncate:500", "ok"] for name in files}
    server = http_server(files, Faults(script=script))
    source = JsonlSource([server.url(n) for n in files], retry=FAST, parse=parse)
    assert [r["id"] for r in stream(source)] == list(range(TOTAL))
    ranges = [r.range for r in server.requests if r.path.endswith("part-0" + SUFFIX[compression])]
    assert len(ranges) == 3, ranges  # two cut, the third whole
    if compression is None:
        assert all(r and r != "bytes=0-" for r in ranges[1:]), ranges  # resumed at an offset


def test_a_malformed_line_is_named_and_can_be_skipped(tmp_path, parse):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": oops}\n{"a": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3 is not JSON"):
        stream(JsonlSource([str(path)], parse=parse))
    source = JsonlSource(
        [str(path)], on_error="skip", max_skipped=1, lines_per_file=[3], parse=parse
    )
    assert stream(source) == [{"a": 1}, {"a": 3}]
    assert source.skipped == 1 and "line 3" in source.skip_log[0]
    with pytest.raises(ValueError, match="needs lines_per_file"):
        JsonlSource([str(path)], on_error="skip", max_skipped=1)


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_truncated_compressed_file_is_a_fetch_error(tmp_path, compression):
    data = file_set(compression)[f"part-1{SUFFIX[compression]}"]
    path = tmp_path / f"cut{SUFFIX[compression]}"
    path.write_bytes(data[: len(data) - 7])
    with pytest.raises(FetchError, match=r"truncated|corrupt") as caught:
        stream(JsonlSource([str(path)]))
    assert caught.value.target.endswith(path.name)


def test_compression_and_parse_are_checked():
    with pytest.raises(ValueError, match="compression must be one of"):
        JsonlSource(["a.jsonl"], compression="brotli")
    with pytest.raises(ValueError, match="parse must be one of"):
        JsonlSource(["a.jsonl"], parse="orjson")


@pytest.mark.parametrize("compression", [None, "zst"])
def test_source_state_resumes_exactly(tmp_path, compression, parse):
    paths = write(tmp_path, file_set(compression))

    def make():
        return JsonlSource(
            paths, shuffle=True, seed=3, shuffle_buffer=7, lines_per_file=SIZES, parse=parse
        )

    async def run():
        reference = [r["id"] async for r in make()]
        assert sorted(reference) == list(range(TOTAL)) and reference != list(range(TOTAL))
        for k in (0, 1, 29, 61, TOTAL - 1):
            first = make()
            it = aiter(first)
            seen = [(await anext(it))["id"] for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))
            await it.aclose()
            second = make()
            second.load_state_dict(state)
            assert seen + [r["id"] async for r in second] == reference, k

    asyncio.run(run())


@pytest.mark.parametrize("counted", [True, False], ids=["lines_per_file", "uncounted"])
def test_a_resume_reads_a_plain_file_from_the_mark_before_its_line(
    http_server, monkeypatch, parse, counted
):
    """Marks about every MARK_BYTES of a plain file travel in the state (JSON); a resumed
    source asks for the file from the last mark before its first line due, not from its
    start, and yields the same lines. Without lines_per_file the epoch is read from its start
    (the lines before are not known to lie in earlier files)."""
    monkeypatch.setattr("asyncloader.sources._columnar.line_runs.MARK_BYTES", 200)
    files = file_set(None)
    sizes = SIZES if counted else None

    async def run():
        for k in (1, 40, 70, TOTAL - 1):
            # a server each: the first source's reading ahead may still be asking meanwhile
            first_server, second_server = http_server(files), http_server(files)
            first = JsonlSource(
                [first_server.url(n) for n in files], lines_per_file=sizes, parse=parse
            )
            it = aiter(first)
            seen = [(await anext(it))["id"] for _ in range(k)]
            state = json.loads(json.dumps(first.state_dict()))
            await it.aclose()
            assert state["line_marks"], state
            urls = [second_server.url(n) for n in files]
            second = JsonlSource(urls, lines_per_file=sizes, parse=parse)
            second.load_state_dict(state)
            assert seen + [r["id"] async for r in second] == list(range(TOTAL)), k
            starts = [r.range for r in second_server.requests]
            if counted and k >= 40:  # past the first file's first mark
                assert starts[0] not in (None, "bytes=0-"), starts
            if not counted:
                assert starts[0] in (None, "bytes=0-"), starts

    asyncio.run(run())


def test_ranks_split_the_lines_into_equal_shares(tmp_path, parse):
    """Without lines_per_file, the ranks count the files first."""
    paths = write(tmp_path, file_set("gz"))
    shares = [
        [r["id"] for r in stream(JsonlSource(paths, rank=k, world_size=3, parse=parse))]
        for k in range(3)
    ]
    assert [len(s) for s in shares] == [TOTAL // 3] * 3
    every = [i for s in shares for i in s]
    assert len(set(every)) == TOTAL - TOTAL % 3 == len(every)


def test_a_file_holding_other_than_lines_per_file_is_named(tmp_path):
    paths = write(tmp_path, file_set(None))
    with pytest.raises(ValueError, match=r"shard_urls\[0\] holds 30 samples, fewer"):
        stream(JsonlSource(paths, lines_per_file=[31, 45, 25]))


@pytest.mark.parametrize("compression", [None, "gz"])
def test_unshuffled_loader_resumes_exactly(tmp_path, compression, parse):
    """The default (unshuffled: files in order, the next read ahead), resumed through the
    loader's state after any k batches: the batches that follow are the same."""
    from tests.helpers.contracts import check_resume

    paths = write(tmp_path, file_set(compression))

    def make():
        return AsyncLoader(JsonlSource(paths, parse=parse), batch_size=5, collate_fn=list)

    check_resume(make, key=lambda batch: [row["id"] for row in batch])


def test_a_line_longer_than_the_limit_is_refused_and_long_lines_are_read(tmp_path):
    """A line split over many chunks is read whole; one over max_object_size is a
    FetchError, before it is all held."""
    path = tmp_path / "long.jsonl"
    long = {"text": "x" * (3 << 20)}
    path.write_bytes(json.dumps(long).encode() + b'\n{"a": 1}\n')
    assert stream(JsonlSource([str(path)])) == [long, {"a": 1}]
    with pytest.raises(FetchError, match="a line over max_object_size=1048576"):
        stream(JsonlSource([str(path)], max_object_size=1 << 20))


def peak_while(run) -> int:
    """The most Python memory ``run()`` held at once, in bytes."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_compressed_line_bomb_is_refused_before_it_is_inflated(tmp_path, compression):
    """64 MB of one line compress to kilobytes; the line is refused once over
    max_object_size, holding a few megabytes, not the 64 MB."""
    line = b'{"x": "' + b"x" * (64 << 20) + b'"}\n'
    path = tmp_path / f"bomb{SUFFIX[compression]}"
    path.write_bytes(gzip.compress(line) if compression == "gz" else zstd_bytes(line))
    del line

    def read() -> None:
        with pytest.raises(FetchError, match="a line over max_object_size=1048576"):
            stream(JsonlSource([str(path)], max_object_size=1 << 20))

    assert peak_while(read) < 16 << 20


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_file_that_inflates_far_is_read_a_piece_at_a_time(tmp_path, compression, parse):
    """72 MB of short lines compress to kilobytes; reading the first lines inflates only
    the first pieces."""
    lines = b'{"a": 1}\n' * (8 << 20)
    path = tmp_path / f"far{SUFFIX[compression]}"
    path.write_bytes(gzip.compress(lines) if compression == "gz" else zstd_bytes(lines))
    size, lines = len(lines), b""

    async def first_rows() -> list:
        it = aiter(JsonlSource([str(path)], parse=parse))
        rows = [await anext(it) for _ in range(10)]
        await it.aclose()
        return rows

    got: list = []
    peak = peak_while(lambda: got.extend(asyncio.run(first_rows())))
    assert got == [{"a": 1}] * 10
    assert peak < 16 << 20, (peak, size)


def zstd_bytes(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def test_arrow_batches_equal_dataloaders_of_the_same_rows(tmp_path, parse):
    """Under the default collate, each batch built from pyarrow's columns is default_collate
    of its rows, every row comes once, and (where the training process makes the batches in
    order) the batches are DataLoader's; on the loop, with 2 workers, fetching in them."""
    from torch.utils.data import DataLoader, default_collate

    from tests.integration.sources.test_arrow_rows import same

    plain = [{**row, "maybe": 0, "tokens": [row["id"]] * 3} for row in rows(0, TOTAL)]
    data = "".join(json.dumps(row) + "\n" for row in plain).encode()
    cut = data.index(b"\n", len(data) // 3) + 1
    paths = write(tmp_path, {"a.jsonl": data[:cut], "b.jsonl": data[cut:]})
    for options in ({}, {"num_workers": 2}, {"num_workers": 2, "fetch_in_workers": True}):
        ours = list(AsyncLoader(JsonlSource(paths, parse=parse), batch_size=8, **options))
        for batch in ours:
            assert same(batch, default_collate([plain[i] for i in batch["id"].tolist()]))
        assert sorted(i for b in ours for i in b["id"].tolist()) == list(range(TOTAL))
        if "fetch_in_workers" not in options:
            reference = DataLoader(plain, batch_size=8)
            assert all(same(a, b) for a, b in zip(ours, reference, strict=True)), options


def test_arrow_rows_are_what_pyarrow_reads(tmp_path, monkeypatch):
    """pyarrow infers a type per column of a block: a missing key is None and ints beside
    floats are floats; blocks whose schemas differ are joined as rows; a block pyarrow cannot
    read (a line that is not an object) is parsed line by line."""
    monkeypatch.setattr("asyncloader.sources._columnar.jsonl.BLOCK_BYTES", 20)
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2.5, "b": "x"}\n{"a": 3}\n{"a": 4}\n[5]\n{"a": 6}\n')
    want = [{"a": 1.0, "b": None}, {"a": 2.5, "b": "x"}, {"a": 3}, {"a": 4}, [5], {"a": 6}]
    got = stream(JsonlSource([str(path)], parse="arrow"))
    assert got == want and [type(r["a"]) for r in got[:4]] == [float, float, int, int]
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_bytes(b'{"a": 1}\n{"a": 2.5}\n{"a": 3}\n{"a": 4}\n')
    (batch,) = AsyncLoader(JsonlSource([str(numbers)], parse="arrow"), batch_size=4)
    assert batch["a"].tolist() == [1.0, 2.5, 3.0, 4.0]  # one batch over both schemas
