"""Malformed tar shards and WebDataset's grouping rules (issue 33, items 1 and 9).

A malformed archive fails at once with a permanent error naming the byte offset (through
ShardedSource: a FetchError naming the shard, after one attempt), never spins, and is
skipped under ``on_error="skip"``. Samples: a repeated field, a reserved field name or too
many fields is an error; contiguous files are read; links, devices and directories are
read past and logged.
"""

from __future__ import annotations

import asyncio
import logging
import tarfile

import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import Retry, ShardedSource
from asyncloader.sources._retry import Permanent, Transient
from asyncloader.sources._sharded import tar as _tar
from asyncloader.sources._sharded.shardplan import Slice
from asyncloader.sources._sharded.tar import members
from tests.helpers.tars import (
    BLOCK,
    archive,
    base256,
    header,
    long_name,
    member,
    no_spin,
    pax,
    record,
)

# A truncation is retried: two attempts tell it from a permanent failure (one attempt).
TWICE = Retry(attempts=2, backoff=0.0, max_backoff=0.0)
GOOD = member("z.txt", b"after")


async def chunks_of(data, size):
    for i in range(0, len(data), size):
        await asyncio.sleep(0)
        yield data[i : i + size]


def read_all(data, limit=None, size=100):
    """The reader's members of ``data`` (in chunks of ``size``), under a 5 s CPU budget."""

    async def run():
        return [m async for m in members(chunks_of(data, size), 0, limit)]

    with no_spin(5.0):
        return asyncio.run(run())


def shard(tmp_path, data, name="bad.tar"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def samples_of(path, **kwargs):
    """Every sample of the shard at ``path`` as ShardedSource groups them."""
    source = ShardedSource([path], retry=TWICE, **kwargs)

    async def run():
        return [s async for s in source.samples(Slice(0, 0, None))]

    with no_spin(5.0):
        return asyncio.run(run())


def fails_at(tmp_path, data, offset, match=""):
    """Reading ``data`` as a shard raises a permanent FetchError after one attempt, naming
    the shard and ``offset``; returns it."""
    path = shard(tmp_path, data)
    with pytest.raises(FetchError) as info:
        samples_of(path)
    error = info.value
    assert error.target == path and error.attempts == 1, str(error)
    assert "permanent" in error.reason and f"offset {offset}" in error.cause, str(error)
    assert match in error.cause, str(error)
    return error


# -- item 1: the pax parser, sizes ---------------------------------------------------------


@pytest.mark.parametrize(
    "records",
    [
        b"0 a=b\n",  # the issue's 1.5 KB shard: a zero length never advanced
        b"3 a=b\n",  # shorter than its own framing
        b"4 a=\n",  # under the shortest record, "5 a=\n"
        b"99 a=b\n",  # past the header's data
        b"x a=b\n",  # no length
        b"+6 a=b\n",  # a sign is no digit
        b"6 ab\n\n",  # no "="
        b"6 =bc\n",  # no key
        b"6 a=bc",  # no newline at its end
        record("path", "a.txt") + b"junk",  # bytes after the last record
    ],
)
def test_a_malformed_pax_record_fails_at_once_naming_its_offset(tmp_path, records):
    """The pax header at 0 is refused (never a spin), as Permanent naming offset 0."""
    data = archive(pax(records), GOOD)
    with pytest.raises(Permanent, match="pax header at offset 0"):
        read_all(data)
    fails_at(tmp_path, data, 0)


def test_pax_records_padded_with_zeros_are_read():
    """Trailing NULs after the records are padding (as tarfile reads them)."""
    data = archive(pax(record("path", "long/name.txt") + bytes(7)), member("x", b"abc"))
    assert [(m.name, m.data) for m in read_all(data)] == [("long/name.txt", b"abc")]


@pytest.mark.parametrize(
    "parts",
    [
        [header("a.txt", size=base256(-512))],  # base-256 negative: was a 60 s "truncation"
        [pax({"size": "-5"}), member("a.txt", b"abc")],
        [pax({"size": "5x"}), member("a.txt", b"abc")],
        [pax({"size": " 3"}), member("a.txt", b"abc")],
    ],
    ids=["base256", "pax-negative", "pax-suffix", "pax-space"],
)
def test_a_negative_or_non_decimal_size_is_permanent_not_a_truncation(tmp_path, parts):
    data = archive(*parts)
    with pytest.raises(Permanent, match="size"):
        read_all(data)
    fails_at(tmp_path, data, 0, "size")


def test_a_truncation_is_still_retried_and_names_its_offset(tmp_path):
    """A shard cut short may be a body cut in transit: Transient, retried, offset named."""
    data = archive(member("a.txt", b"abc"), member("b.txt", bytes(900)))[: 3 * BLOCK]
    with pytest.raises(Transient, match="at offset 1024"):
        read_all(data)
    with pytest.raises(FetchError, match="at offset 1024") as info:
        samples_of(shard(tmp_path, data))
    assert info.value.attempts == 2


@pytest.mark.parametrize(
    ("parts", "offset", "match"),
    [
        ([pax({"path": "a.txt"}), pax({"size": "3"}), member("a", b"abc")], 1024, "two pax"),
        ([long_name(b"a.txt\0"), long_name(b"b.txt\0"), member("a", b"abc")], 1024, "two"),
        ([long_name(b"a.txt\0"), pax({"path": "b.txt"}), member("a", b"abc")], 0, "both"),
        ([long_name(b"a.txt"), member("a", b"abc")], 0, "NUL"),
        ([pax({"path": ""}), member("a.txt", b"abc")], 0, "name"),
        ([member("dir/", b"abc", tarfile.REGTYPE)], 0, "name"),
        ([pax({"path": "a.txt"}, tarfile.XGLTYPE), member("b", b"abc")], 0, "global"),
        ([pax({"GNU.sparse.major": "1"}), member("a.txt", b"abc")], 0, "sparse"),
        ([member("a.txt", b"abc", tarfile.GNUTYPE_SPARSE)], 0, "sparse"),
        ([member("d", b"data!", tarfile.DIRTYPE)], 0, "directory"),
        ([member("l", b"data!", tarfile.LNKTYPE)], 0, "hard link"),
        ([GOOD, pax({"path": "a.txt"})], 1024, "no member"),
    ],
    ids=[
        "two-pax",
        "two-long-names",
        "long-name-and-pax-path",
        "long-name-without-nul",
        "empty-pax-path",
        "name-ending-in-slash",
        "global-path",
        "pax-sparse",
        "gnu-sparse",
        "directory-with-data",
        "link-with-data",
        "dangling-pax",
    ],
)
def test_an_ambiguous_or_unsupported_archive_is_malformed(tmp_path, parts, offset, match):
    """What readers disagree on, or cannot be read as bytes, fails naming the offset."""
    data = archive(*parts)
    with pytest.raises(Permanent, match=f"offset {offset}"):
        read_all(data)
    fails_at(tmp_path, data, offset, match)


def test_metadata_over_its_limit_is_refused_before_it_is_read():
    big = BLOCK * 4096
    data = archive(header("././@PaxHeader", tarfile.XHDTYPE, _tar.MAX_META + 1)) + bytes(big)
    with pytest.raises(Permanent, match="offset 0"):
        read_all(data, size=big)


# -- item 9: samples -----------------------------------------------------------------------


def test_contiguous_files_are_regular_files(tmp_path):
    """Type '7' is a regular file per POSIX: its bytes are a field like any other."""
    data = archive(member("k.jpg", b"jpeg", tarfile.CONTTYPE), member("k.txt", b"cls"))
    got = samples_of(shard(tmp_path, data))
    assert [(s["__key__"], s.get("jpg"), s.get("txt")) for s in got] == [("k", b"jpeg", b"cls")]


def test_a_repeated_field_is_an_error_as_in_webdataset(tmp_path):
    """k.jpg twice: webdataset raises ValueError; here a FetchError naming the member."""
    data = archive(member("k.jpg", b"1"), member("k.txt", b"t"), member("k.jpg", b"2"))
    fails_at(tmp_path, data, 4 * BLOCK, "'k.jpg'")


@pytest.mark.parametrize("field", ["__key__", "__url__", "__local_path__"])
def test_a_reserved_field_name_is_an_error(tmp_path, field):
    """k.__key__ would replace the sample's own key: refused, not silently applied."""
    data = archive(member("k.txt", b"t"), member(f"k.{field}", b"spoofed"))
    fails_at(tmp_path, data, 2 * BLOCK, "reserved")


def test_the_fields_of_a_sample_are_capped(tmp_path):
    """MAX_FIELDS fields make a sample; one more is an error, not a sample without bound."""
    limit = getattr(_tar, "MAX_FIELDS", 1024)
    fields = [member(f"k.{i}", b"x") for i in range(limit)]
    path = shard(tmp_path, archive(*fields, member("j.txt", b"next")))
    got = samples_of(path)
    assert [len(s) - 2 for s in got] == [limit, 1]
    error = fails_at(tmp_path, archive(*fields, member(f"k.{limit}", b"x")), 2 * BLOCK * limit)
    assert f"{limit} fields" in error.cause


def test_links_devices_and_directories_are_read_past_and_logged(tmp_path, caplog):
    """webdataset reads regular files only, as here; but each shard read says what it left."""
    data = archive(
        member("d", b"", tarfile.DIRTYPE),
        member("k.jpg", b"jpeg"),
        member("k.png", b"", tarfile.LNKTYPE),
        member("k.lnk", b"", tarfile.SYMTYPE),
        member("f", b"", tarfile.FIFOTYPE),
        member("j.jpg", b"j"),
    )
    path = shard(tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="asyncloader.sources"):
        got = samples_of(path)
    assert [(s["__key__"], sorted(s)) for s in got] == [
        ("k", ["__key__", "__url__", "jpg"]),
        ("j", ["__key__", "__url__", "jpg"]),
    ]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if path in r.getMessage()]
    warned = [message for level, message in logged if level == logging.WARNING]
    assert len(warned) == 3, logged
    for what in ("hard link 'k.png' at offset 1536", "symbolic link 'k.lnk'", "FIFO 'f'"):
        assert any(what in message for message in warned), (what, warned)


def test_directories_and_repeats_are_logged_at_debug(tmp_path, caplog):
    """A directory holds nothing: it is logged at debug level, and so is a second link."""
    data = archive(
        member("d", b"", tarfile.DIRTYPE),
        member("d/k.jpg", b"jpeg"),
        member("d/k.png", b"", tarfile.LNKTYPE),
        member("d/k.gif", b"", tarfile.LNKTYPE),
    )
    path = shard(tmp_path, data)
    with caplog.at_level(logging.DEBUG, logger="asyncloader.sources"):
        assert [s["__key__"] for s in samples_of(path)] == ["d/k"]
    levels = [r.levelno for r in caplog.records if path in r.getMessage()]
    assert levels == [logging.DEBUG, logging.WARNING, logging.DEBUG]


# -- through the loader ----------------------------------------------------------------------


def test_the_issues_shard_ends_the_loader_with_a_fetch_error(tmp_path):
    """The 1.5 KB shard: the loader's consumer gets a FetchError at once, no spin."""
    data = archive(member("a.txt", b"x"), pax(b"0 a=b\n"), member("b.txt", b"y"))
    path = shard(tmp_path, data)

    async def run():
        source = ShardedSource([path], retry=TWICE)
        async with AsyncLoader(source, batch_size=2, collate_fn=list) as loader:
            return [b async for b in loader]

    with no_spin(10.0), pytest.raises(FetchError, match="offset 1024") as info:
        asyncio.run(run())
    assert info.value.attempts == 1


def test_a_malformed_shard_is_skipped_under_on_error_skip(tmp_path):
    """Permanent like a 404: skipped with its samples counted; the other shards come."""
    good = archive(member("a.txt", b"1"), member("b.txt", b"2"))
    bad = archive(member("c.txt", b"3"), member("c.txt", b"4"))
    paths = [shard(tmp_path, good, "good.tar"), shard(tmp_path, bad, "bad.tar")]
    source = ShardedSource(
        paths, samples_per_shard=[2, 2], on_error="skip", max_skipped=2, retry=TWICE, shuffle=False
    )
    with no_spin(10.0):
        got = [s["__key__"] for batch in AsyncLoader(source, collate_fn=list) for s in batch]
    assert got == ["a", "b"]
    assert source.skipped == 2 and "repeats" in source.skip_log[0]
