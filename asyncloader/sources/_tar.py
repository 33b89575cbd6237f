"""Reads the regular-file members of a tar stream, chunk by chunk, knowing where each ends.

Handles ustar, GNU long names (``L``) and pax headers (``x``: ``path`` and ``size``); global
pax headers, directories, links and devices are read past. Only member bytes are returned:
nothing is extracted to disk, unpickled or executed.

Each member comes with ``end``, the offset of the header that follows it, so a stream that
breaks can be resumed there with a ranged read. A stream that ends anywhere but after the
end-of-archive block (a zero block) is truncated: :class:`Transient`, and so retried.
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator
from typing import NamedTuple

from asyncloader.sources._retry import Permanent, Transient

BLOCK = 512


class Member(NamedTuple):
    """One regular file of the archive."""

    name: str
    data: bytes
    end: int


class _Reader:
    """Exact reads over an async iterator of chunks, counting the offset."""

    def __init__(self, chunks: AsyncIterator[bytes], offset: int) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self.offset = offset

    async def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes, or fewer only at the end of the stream."""
        while len(self._buf) < n:
            chunk = await anext(self._chunks, None)
            if chunk is None:
                break
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self.offset += len(out)
        return out

    async def exactly(self, n: int, what: str) -> bytes:
        data = await self.read(n)
        if len(data) != n:
            raise Transient(f"truncated tar: {what} cut at {len(data)} of {n} bytes")
        return data


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _pax(data: bytes) -> dict[str, str]:
    """The records ``"<len> key=value\\n"`` of a pax header."""
    out, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


async def members(
    chunks: AsyncIterator[bytes], start: int, max_member_size: int | None
) -> AsyncIterator[Member]:
    """Yields the regular files of the tar stream ``chunks``, which begins at offset ``start``.

    Raises:
        Transient: The stream ended early (no end-of-archive block).
        Permanent: A header is corrupt, or a member is over ``max_member_size`` bytes.
    """
    reader = _Reader(chunks, start)
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        block = await reader.read(BLOCK)
        if not block:
            raise Transient("truncated tar: the stream ended without an end-of-archive block")
        if len(block) < BLOCK:
            raise Transient(f"truncated tar: a header cut at {len(block)} bytes")
        if block == bytes(BLOCK):
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise Permanent(
                f"corrupt tar header at offset {reader.offset - BLOCK}: {exc}"
            ) from None
        size = int(pax.get("size", info.size))
        if max_member_size is not None and size > max_member_size:
            raise Permanent(f"tar member {info.name!r} is {size} bytes, over {max_member_size}")
        data = await reader.exactly(_padded(size), f"member {info.name!r}")
        data = data[:size]
        if info.type == tarfile.GNUTYPE_LONGNAME:
            long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif info.type == tarfile.XHDTYPE:
            pax = _pax(data)
        elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            name = pax.get("path") or long_name or info.name
            long_name, pax = None, {}
            yield Member(name, data, reader.offset)
        elif info.type != tarfile.XGLTYPE:
            long_name, pax = None, {}


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's grouping: ``dir/abc.seg.png`` is key ``dir/abc``, field ``seg.png``."""
    slash = name.rfind("/") + 1
    base, dot, ext = name[slash:].partition(".")
    return name[:slash] + base, ext if dot else ""
