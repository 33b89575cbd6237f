"""The streaming tar reader: members with their end offsets, long names, truncation, resume."""

import asyncio
import io
import tarfile

import pytest

from asyncloader.sources._retry import Permanent, Transient
from asyncloader.sources._sharded.tar import members
from tests.helpers import make_shard


async def chunks_of(data, size=100):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def read_all(data, start=0, limit=None, size=100):
    async def run():
        return [m async for m in members(chunks_of(data[start:], size), start, limit)]

    return asyncio.run(run())


def test_members_come_with_names_bytes_and_the_offset_after_them():
    """Each regular file is yielded whole; `end` is where the next header starts."""
    data = make_shard([("a", {"txt": b"hello", "bin": bytes(600)}), ("b", {"txt": b"x"})])
    got = read_all(data, size=37)
    assert [(m.name, m.data) for m in got] == [
        ("a.txt", b"hello"), ("a.bin", bytes(600)), ("b.txt", b"x")
    ]  # fmt: skip
    assert [m.end for m in got] == [1024, 1024 + 512 + 1024, 1024 + 512 + 1024 + 1024]


def test_resuming_at_a_members_end_yields_exactly_the_rest():
    """A stream restarted at `end` of member k yields members k+1.. and nothing else."""
    data = make_shard([(f"k{i}", {"txt": bytes([i]) * (300 * i)}) for i in range(6)])
    whole = read_all(data)
    rest = read_all(data, start=whole[2].end)
    assert [m.name for m in rest] == [m.name for m in whole[3:]]
    assert [m.data for m in rest] == [m.data for m in whole[3:]]


def test_long_names_pax_and_gnu_are_read():
    """Names over 100 characters work in pax and GNU formats."""
    name = "d" * 120 + "/sample.jpg"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        assert [(m.name, m.data) for m in read_all(out.getvalue())] == [(name, b"abc")]


@pytest.mark.parametrize("cut", [100, 512, 700, 1024 + 512 + 10, "boundary"])
def test_a_truncated_archive_is_transient(cut):
    """A stream cut anywhere before the end-of-archive block raises Transient (retried)."""
    data = make_shard([("a", {"txt": b"hello"}), ("b", {"bin": b"1" * 2000})])
    if cut == "boundary":  # after the last member's padding: only the end blocks are missing
        cut = -(-len(data.rstrip(b"\0")) // 512) * 512
    with pytest.raises(Transient, match="truncated tar"):
        read_all(data[:cut])


def test_a_corrupt_header_is_permanent_and_a_big_member_is_refused():
    """A bad checksum is Permanent; a member over the limit is refused before its bytes."""
    data = bytearray(make_shard([("a", {"txt": b"hello"})]))
    data[150] ^= 0xFF  # inside the checksum field
    with pytest.raises(Permanent, match="corrupt tar header at offset 0"):
        read_all(bytes(data))
    with pytest.raises(Permanent, match="over 1000"):
        read_all(make_shard([("a", {"bin": bytes(2000)})]), limit=1000)
