"""Reads the regular-file members of a tar stream, chunk by chunk, knowing where each ends;
groups them into WebDataset samples.

Formats: ustar and v7; GNU (``L`` long names; ``K`` long link names are read past); pax
(``x``/``X`` headers: ``path`` and ``size``; global ``g`` headers are read past). Regular
files (types ``0``, NUL and ``7``, contiguous) are yielded. Directories, hard and symbolic
links, devices and FIFOs hold no data: they are read past and counted in ``ignored``, as
are members of an unknown type (their data skipped). Only member bytes are returned:
nothing is extracted to disk, unpickled or executed.

Invariants:

- No input makes the reader spin: each header takes a block, each pax record at least 5
  bytes, and the reader awaits the stream whenever its buffer runs dry.
- What the reader cannot read one way only is :class:`MalformedTar`, a :class:`Permanent`
  error (the same bytes fail the same way: not retried) naming the byte offset of the
  header at fault: a corrupt header (checksum, number fields), a negative or non-decimal
  size, a malformed pax record, a sparse member, a directory, link, device or FIFO with
  data, two pax headers or two long names for one member, a long name and a pax ``path``
  together, a long name without its NUL, an empty name or one ending in ``/``, a global
  pax header setting ``path`` or ``size``, metadata over :data:`MAX_META` bytes, metadata
  with no member after it.
- A stream that ends anywhere but at an end-of-archive block (a zero block) is truncated:
  :class:`Transient`, and so retried (a body cut short in transit reads the same).
- Each member comes with ``end``, the offset of the header that follows it, so a stream
  that breaks can be resumed there with a ranged read; and ``start``, the offset of its
  first header (its pax or long-name header, if any), which errors name.
"""

from __future__ import annotations

import logging
import tarfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

from asyncloader.sources._retry import Permanent, Transient

BLOCK = 512
MAX_META = 1 << 20
"""Bytes of one pax header's records or one GNU long name, at most."""
MAX_FIELDS = 1024
"""Fields of one sample (members of one key), at most."""

_ZERO = bytes(BLOCK)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_PAX = (b"x", b"X")  # pax extended header (X: Solaris's); tarfile does not document these
_GLOBAL = b"g"  # pax global header
_META = (*_PAX, _GLOBAL, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
# The types that hold no data: a size other than 0 is refused (readers disagree on it).
_NO_DATA = {
    tarfile.DIRTYPE: "directory",
    tarfile.LNKTYPE: "hard link",
    tarfile.SYMTYPE: "symbolic link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
}
_GLOBAL_REFUSED = ("path", "size")
log = logging.getLogger("asyncloader.sources")


class MalformedTar(Permanent):
    """Bytes that are not a tar archive this reader reads one way only; the message names
    the byte offset. Permanent: reading them again gives the same bytes."""


class Member(NamedTuple):
    """One regular file of the archive: its bytes, where its headers start and where the
    next member's start."""

    name: str
    data: bytes
    end: int
    start: int = 0


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

    async def exactly(self, n: int, what: str, at: int) -> bytes:
        """``n`` bytes of ``what`` (whose header is at ``at``), else Transient."""
        data = await self.read(n)
        if len(data) != n:
            raise Transient(f"truncated tar: {what} at offset {at} cut at {len(data)} of {n} bytes")
        return data

    async def skip(self, n: int, what: str, at: int) -> None:
        """Reads past ``n`` bytes without keeping them, else Transient."""
        while n:
            n -= len(await self.exactly(min(n, 1 << 20), what, at))


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _record(data: bytes, pos: int, at: int) -> tuple[bytes, bytes, int]:
    """``(key, value, end)`` of the pax record at byte ``pos`` of the header at ``at``."""
    space = data.find(b" ", pos, pos + 21)
    digits = data[pos:space] if space > pos else b""
    end = pos + int(digits) if digits.isdigit() else -1  # bytes: ASCII digits only
    key, eq, value = data[space + 1 : end - 1].partition(b"=")
    if end - pos < 5 or end > len(data) or data[end - 1] != 0x0A or not (key and eq):
        raise MalformedTar(
            f"malformed pax header at offset {at}: the record at its byte {pos} is not "
            '"<length> key=value\\n" within the header'
        )
    return key, value, end


def _pax(data: bytes, at: int) -> dict[str, str]:
    """The records ``"<length> key=value\\n"`` of the pax header at offset ``at``.

    ``length`` counts the whole record, itself included, so it is at least 5 (``"5 k=\\n"``)
    and each record advances the parse. NULs after the last record are padding.
    """
    out, pos = {}, 0
    while pos < len(data) and data[pos]:
        key, value, pos = _record(data, pos, at)
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    if any(data[pos:]):
        raise MalformedTar(f"malformed pax header at offset {at}: bytes after its records")
    return out


def _size(info: tarfile.TarInfo, pax: dict[str, str] | None, at: int) -> int:
    """The size of the member whose header is at ``at``: its pax ``size``, else the header's."""
    size = info.size
    if pax is not None and "size" in pax:
        text = pax["size"]
        if not (text.isascii() and text.isdigit()):
            raise MalformedTar(f"the pax size {text!r} of the member at offset {at} is not decimal")
        size = int(text)
    if size < 0:
        raise MalformedTar(f"the member at offset {at} has a negative size ({size})")
    return size


class _Headers:
    """The metadata headers read for the member that follows them, and the checks on them."""

    def __init__(self) -> None:
        self.start: int | None = None  # offset of the first of them
        self.pax: dict[str, str] | None = None
        self.long_name: str | None = None

    def add(self, kind: bytes, data: bytes, at: int) -> None:
        """Takes the metadata header of type ``kind`` at ``at`` with its ``data``; a global
        pax header is no part of the member after it."""
        if self.start is None and kind != _GLOBAL:
            self.start = at
        if kind in _PAX:
            self._add_pax(data, at)
        elif kind == _GLOBAL:
            refused = [k for k in _pax(data, at) if k in _GLOBAL_REFUSED or "sparse" in k]
            if refused:
                raise MalformedTar(f"the global pax header at offset {at} sets {refused}")
        elif kind == tarfile.GNUTYPE_LONGNAME:
            self._add_long_name(data, at)

    def _add_pax(self, data: bytes, at: int) -> None:
        if self.pax is not None:
            raise MalformedTar(f"two pax headers for one member, the second at offset {at}")
        self.pax = _pax(data, at)
        if any(key.startswith("GNU.sparse.") for key in self.pax):
            raise MalformedTar(f"a sparse member (pax header at offset {at}): not supported")

    def _add_long_name(self, data: bytes, at: int) -> None:
        if self.long_name is not None:
            raise MalformedTar(f"two GNU long names for one member, the second at offset {at}")
        if b"\0" not in data:
            raise MalformedTar(f"the GNU long name at offset {at} has no terminating NUL")
        self.long_name = data[: data.index(b"\0")].decode("utf-8", "surrogateescape")

    def name(self, info: tarfile.TarInfo, at: int) -> str:
        """The member's name: its pax ``path``, its long name, or its header's."""
        path = None if self.pax is None else self.pax.get("path")
        if path is not None and self.long_name is not None:
            raise MalformedTar(f"the member at offset {at} has both a GNU long name and a pax path")
        name = path if path is not None else self.long_name
        name = info.name if name is None else name
        if info.type in _REGULAR and (not name or name.endswith("/")):
            raise MalformedTar(f"the regular file at offset {at} is named {name!r}")
        return name


Ignored = Callable[[str, str, int], None]
"""``ignored(kind, name, offset)``: a member that is not a regular file was read past."""


async def _header(reader: _Reader) -> tarfile.TarInfo | None:
    """The next header, or None at the end-of-archive block."""
    at = reader.offset
    block = await reader.read(BLOCK)
    if not block:
        raise Transient(f"truncated tar: the stream ended at offset {at} without an end block")
    if len(block) < BLOCK:
        raise Transient(f"truncated tar: the header at offset {at} cut at {len(block)} bytes")
    if block == _ZERO:
        return None
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError) as exc:
        raise MalformedTar(f"corrupt tar header at offset {at}: {exc}") from None


def _limit(info: tarfile.TarInfo, size: int, at: int, max_member_size: int | None) -> None:
    """Refuses a member or metadata over its limit, or a data-less type that has data."""
    if info.type in _META:
        if size > MAX_META:
            raise MalformedTar(f"the metadata at offset {at} is {size} bytes, over {MAX_META}")
    elif info.type in _NO_DATA:
        if size:
            kind = _NO_DATA[info.type]
            raise MalformedTar(f"the {kind} at offset {at} has {size} bytes of data")
    elif info.type == tarfile.GNUTYPE_SPARSE:
        raise MalformedTar(f"a sparse member at offset {at}: not supported")
    elif max_member_size is not None and size > max_member_size and info.type in _REGULAR:
        raise Permanent(
            f"tar member {info.name!r} at offset {at} is {size} bytes, over {max_member_size}"
        )


async def _data(
    reader: _Reader,
    info: tarfile.TarInfo,
    pax: dict[str, str] | None,
    where: tuple[int, int],
    max_member_size: int | None,
) -> bytes:
    """The data of the header ``info`` (read past, b"", for other than a regular file or
    metadata), after the checks of its size; ``where``: the offsets of the member's first
    header and of ``info``."""
    first, at = where
    size = _size(info, None if info.type in _META else pax, first)
    _limit(info, size, at, max_member_size)
    if info.type in _META or info.type in _REGULAR:
        return (await reader.exactly(_padded(size), "a member", at))[:size]
    await reader.skip(_padded(size), "a member", at)
    return b""


async def members(
    chunks: AsyncIterator[bytes],
    start: int,
    max_member_size: int | None,
    ignored: Ignored | None = None,
) -> AsyncIterator[Member]:
    """Yields the regular files of the tar stream ``chunks``, which begins at offset ``start``
    (0, or a member's ``end``); calls ``ignored`` for each other member read past.

    Raises:
        Transient: The stream ended early (no end-of-archive block).
        MalformedTar: The bytes are malformed or ambiguous (see the module's docstring).
        Permanent: A member is over ``max_member_size`` bytes.
    """
    reader = _Reader(chunks, start)
    headers = _Headers()
    while True:
        at = reader.offset
        info = await _header(reader)
        if info is None:
            if headers.start is not None:
                raise MalformedTar(f"metadata at offset {headers.start} has no member after it")
            return
        first = at if headers.start is None else headers.start
        data = await _data(reader, info, headers.pax, (first, at), max_member_size)
        if info.type in _META:
            headers.add(info.type, data, at)
            continue
        name = headers.name(info, first)
        headers = _Headers()
        if info.type in _REGULAR:
            yield Member(name, data, reader.offset, first)
        elif ignored is not None:
            ignored(_NO_DATA.get(info.type, f"member of type {info.type!r}"), name, first)


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's grouping: ``dir/abc.seg.png`` is key ``dir/abc``, field ``seg.png``."""
    slash = name.rfind("/") + 1
    base, dot, ext = name[slash:].partition(".")
    return name[:slash] + base, ext if dot else ""


class Grouping:
    """Consecutive members of one key make a sample (WebDataset's rule, :func:`split_key`).

    Invariants: a sample holds each field once (a repeated one is an error, as webdataset
    raises), at most :data:`MAX_FIELDS` fields, and none named like ``__key__``: dunder
    names are the sample's own (``__key__``, ``__url__``), refused rather than overridden.
    """

    def __init__(self) -> None:
        self.key: str | None = None
        self.fields: dict[str, bytes] = {}

    def close(self, key: str) -> tuple[str, dict[str, bytes]] | None:
        """The sample that a member of ``key`` ends (another key's), now taken out."""
        if self.key is None or key == self.key:
            return None
        done = self.key, self.fields
        self.key, self.fields = None, {}
        return done

    def add(self, member: Member, key: str, field: str) -> None:
        """Adds ``member`` (of ``key`` and ``field``) to the current sample.

        Raises:
            MalformedTar: The field is repeated, reserved, or one too many.
        """
        what = f"tar member {member.name!r} at offset {member.start}"
        if field in self.fields:
            raise MalformedTar(f"{what} repeats field {field!r} of sample {key!r}")
        if field.startswith("__") and field.endswith("__"):
            raise MalformedTar(f"{what}: field {field!r} is reserved (dunder names)")
        if len(self.fields) >= MAX_FIELDS:
            raise MalformedTar(f"{what}: sample {key!r} would have over {MAX_FIELDS} fields")
        self.key = key
        self.fields[field] = member.data

    def finish(self) -> tuple[str, dict[str, bytes]] | None:
        """The last sample, if any, now taken out."""
        done = None if self.key is None else (self.key, self.fields)
        self.key, self.fields = None, {}
        return done


class IgnoredMembers:
    """Counts the members of one shard read past (not regular files), by kind, and logs
    them: the first of each kind as a warning (a directory at debug level: it holds
    nothing), the others at debug level. A member read again by a resumed stream counts
    once."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.counts: Counter[str] = Counter()
        self._last = -1  # the offset of the last one counted

    def __call__(self, kind: str, name: str, offset: int) -> None:
        if offset <= self._last:
            return
        self._last = offset
        self.counts[kind] += 1
        n = self.counts[kind]
        level = logging.WARNING if n == 1 and kind != "directory" else logging.DEBUG
        log.log(
            level,
            "%s: read past %s %r at offset %d, not a regular file (%d of this kind so far; "
            "the next are logged at debug level)",
            *(self.target, kind, name, offset, n),
        )
