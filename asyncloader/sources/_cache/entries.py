"""An entry's file: written whole to a temporary file and renamed, validated at each read.

Format: the object's bytes, then its metadata as JSON (``size``, ``crc32`` of the bytes,
the store's ``version`` where the client reported one: ETag, Last-Modified, size..., the
redacted ``target``), then the JSON's length (4 bytes, big-endian) and ``MAGIC``. The bytes
start at offset 0, so a stream is served from the file as it is.

Invariants:

- a file under ``data/`` was renamed there whole: a crash mid-write leaves only a temporary
  file, which is never served (and is removed by the next download of its key);
- a read serves an entry only when its file is exactly as long as its metadata says and its
  bytes match the CRC-32 recorded when it was written: a truncated, corrupted or malformed
  entry is reported (:class:`Invalid`) and never served. No fsync: the check catches what a
  power cut leaves;
- an entry's mtime is its last use (set at each read);
- whoever reads an entry (and its writer, from the temporary file's creation) holds it in
  use (:func:`.locks.try_lock`, shared) until it closes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncloader.sources._cache.locks import try_lock

MAGIC = b"ALCACHE1"
_TAIL = struct.Struct(">I8s")
_CHUNK = 1 << 20
_MAX_META = 1 << 20


@dataclass(frozen=True)
class Invalid:
    """An entry that must not be served, and why."""

    reason: str


class EntryFile:
    """An entry open for reading and held in use; ``size`` bytes from offset 0."""

    def __init__(self, fd: int, meta: dict[str, Any]) -> None:
        self.fd = fd
        self.meta = meta
        self.size: int = meta["size"]
        self.crc: int = meta["crc32"]
        self._close = weakref.finalize(self, os.close, fd)

    def read(self, start: int, length: int = _CHUNK) -> bytes:
        """Up to ``length`` bytes from ``start`` (none past the object's end)."""
        return os.pread(self.fd, max(0, min(length, self.size - start)), start)

    def close(self) -> None:
        """Releases it (its in-use lock too). Idempotent."""
        self._close()


def encode_meta(meta: dict[str, Any]) -> bytes:
    """The metadata and the tail that follow an entry's bytes."""
    raw = json.dumps(meta, default=str, sort_keys=True).encode()
    return raw + _TAIL.pack(len(raw), MAGIC)


def _read_meta(fd: int, file_size: int) -> dict[str, Any] | Invalid:
    """The metadata at the end of the file ``fd``, checked against its length."""
    if file_size < _TAIL.size:
        return Invalid(f"truncated: {file_size} bytes, no metadata")
    length, magic = _TAIL.unpack(os.pread(fd, _TAIL.size, file_size - _TAIL.size))
    if magic != MAGIC or length > min(_MAX_META, file_size - _TAIL.size):
        return Invalid("truncated or malformed: no metadata at its end")
    try:
        meta: dict[str, Any] = json.loads(os.pread(fd, length, file_size - _TAIL.size - length))
        size, crc = meta["size"], meta["crc32"]
    except (ValueError, KeyError, TypeError):
        return Invalid("malformed metadata")
    if not (isinstance(size, int) and isinstance(crc, int)):
        return Invalid("malformed metadata")
    if size + length + _TAIL.size != file_size:
        return Invalid(f"truncated: {file_size} bytes, {size + length + _TAIL.size} written")
    return meta


def _read_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of ``fd`` (one read, unless the kernel caps it at 2 GiB)."""
    data = os.pread(fd, size, 0)
    if len(data) == size:
        return data
    parts, pos = [data], len(data)
    while pos < size and (chunk := os.pread(fd, size - pos, pos)):
        parts.append(chunk)
        pos += len(chunk)
    return b"".join(parts)


def used_now(fd: int) -> None:
    """Sets the file's mtime (the LRU clock) to now, to the nanosecond: the kernel's own
    file times tick every few milliseconds, too coarse to order reads. A file of another
    user's (a directory shared by several) keeps its time: only its LRU order suffers."""
    now = time.time_ns()
    with contextlib.suppress(PermissionError):
        os.utime(fd, ns=(now, now))


def _crc_of_file(fd: int, size: int) -> int:
    crc, pos = 0, 0
    while pos < size:
        chunk = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not chunk:
            break
        crc, pos = zlib.crc32(chunk, crc), pos + len(chunk)
    return crc


def open_entry(path: Path, load: bool) -> EntryFile | bytes | Invalid | None:
    """The entry at ``path``, validated and marked as just used (its mtime: the LRU clock).

    Returns:
        None when there is none (or eviction is removing it); :class:`Invalid` when it must
        not be served; its bytes when ``load`` (the file closed), else the open file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        if not try_lock(fd, shared=True):
            os.close(fd)
            return None
        found = _validated(fd, load)
    except BaseException:
        os.close(fd)
        raise
    if isinstance(found, dict):
        return EntryFile(fd, found)
    os.close(fd)
    return found


def _validated(fd: int, load: bool) -> dict[str, Any] | bytes | Invalid:
    """The metadata of a valid entry (its bytes when ``load``), or why it is invalid."""
    meta = _read_meta(fd, os.fstat(fd).st_size)
    if isinstance(meta, Invalid):
        return meta
    data = _read_all(fd, meta["size"]) if load else None
    crc = zlib.crc32(data) if data is not None else _crc_of_file(fd, meta["size"])
    if crc != meta["crc32"]:
        return Invalid(f"corrupted: CRC-32 {crc:08x}, {meta['crc32']:08x} written")
    used_now(fd)
    return data if data is not None else meta


class Partial:
    """An entry being written to its temporary file, held in use from its creation.

    Written bytes are appended at ``written``; the CRC-32 runs along. Dropped unfinished (or
    garbage collected), the file is removed; sealed and renamed, it becomes an entry.
    """

    def __init__(self, path: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self.path = path
        self.fd = os.open(path, flags, 0o644)
        try_lock(self.fd, shared=True)  # a new file: no one else can hold it
        self.written = 0
        self.crc = 0
        self.inner_pin: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self._drop = weakref.finalize(self, _discard, self.fd, path, os.getpid())

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            done = os.pwrite(self.fd, view, self.written)
            self.written += done
            view = view[done:]
        self.crc = zlib.crc32(chunk, self.crc)

    def restart(self) -> None:
        """Forgets what was written: the next write is byte 0 of a new download."""
        os.ftruncate(self.fd, 0)
        self.written, self.crc = 0, 0
        self.inner_pin.clear()

    def seal(self, meta: dict[str, Any]) -> int:
        """Appends ``meta`` (with the size and CRC-32); returns the file's size."""
        self.meta = {**meta, "size": self.written, "crc32": self.crc}
        tail = encode_meta(self.meta)
        os.pwrite(self.fd, tail, self.written)
        os.ftruncate(self.fd, self.written + len(tail))
        used_now(self.fd)
        return self.written + len(tail)

    def rename(self, final: Path) -> EntryFile:
        """Renames the sealed file to ``final`` (the caller holds the cache lock): it is an
        entry now, still open and in use."""
        os.rename(self.path, final)
        self._drop.detach()
        return EntryFile(self.fd, self.meta)

    def unlinked(self) -> EntryFile:
        """The bytes written, readable but never an entry (the file is removed now): for an
        object larger than the whole cache."""
        self.path.unlink(missing_ok=True)
        self._drop.detach()
        return EntryFile(self.fd, {"size": self.written, "crc32": self.crc})

    def discard(self) -> None:
        """Closes and removes the temporary file. Idempotent."""
        self._drop()


def _discard(fd: int, path: Path, pid: int) -> None:
    os.close(fd)
    if os.getpid() == pid:  # a forked child's copy closes its fd, never its parent's file
        path.unlink(missing_ok=True)


def remove_dead_temps(temps: list[Path]) -> int:
    """Removes the temporary files whose writer is gone (no one holds them in use); the
    caller holds their key's download lock, so no writer is creating one. Returns how many."""
    removed = 0
    for path in temps:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            continue
        try:
            if try_lock(fd):
                path.unlink(missing_ok=True)
                removed += 1
        finally:
            os.close(fd)
    return removed


def new_meta(target: str, version: dict[str, Any] | None) -> dict[str, Any]:
    """What an entry records besides its size and CRC: the redacted target, the store's
    version (ETag...) where known, when it was written."""
    return {"target": target, "version": version or {}, "written": time.time()}
