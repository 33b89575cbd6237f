"""FileSource: item ``i`` is the bytes of a local file, read with aiofiles.

aiofiles runs the blocking calls in the loop's default thread pool, so many files are read at
once without blocking the loop. Each read (open, seek, read, close) is one call there, made
async by ``aiofiles.os.wrap``: a cancelled fetch (a sibling in its batch failed) then cannot
leave a file open, as it can when cancellation lands between ``aiofiles.open`` and its close;
and it costs one thread hop instead of four. Local errors (a missing file, a permission
refused) are permanent: they fail at the first attempt.

Only regular files are read: a path is opened non-blocking (a FIFO's open would wait for a
writer) and refused, permanently, unless ``fstat`` of what was opened says it is a regular
file (not a FIFO, device, socket or directory). A whole-file read reads at most the size
``fstat`` reported, plus one byte: a file that holds more (one still being written, or one of
``/proc``, whose size reads 0) or less fails as transient, so it is retried and
``max_object_size`` bounds what is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofiles.os

from asyncloader.sources._map import (
    DEFAULT_MAX_OBJECT_SIZE,
    RemoteMap,
    check_common,
    parse_items,
)
from asyncloader.sources._redact import Redactor
from asyncloader.sources._retry import Permanent, Retry, Transient, check_size

_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: str) -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened for reading, blocking; Permanent, and nothing left
    open, when what was opened is not a regular file (opened non-blocking, so a FIFO without
    a writer does not block, then checked with ``fstat`` on the fd, not on the path)."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Permanent(f"{path} is not a regular file (mode {stat.filemode(info.st_mode)})")
        if _OPEN_FLAGS & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _read_sync(path: str, start: int, length: int | None, limit: int | None) -> bytes:
    """``length`` bytes of regular file ``path`` from ``start``, or (``length`` None) the rest
    of it as ``fstat`` sized it. Reads at most ``max(length, size - start + 1)`` bytes.

    Raises:
        Permanent: Not a regular file; over ``limit``; a range past the end of the file.
        Transient: The file held more or fewer bytes than ``fstat`` said when it was read.
    """
    fd, size = _open_regular(path)
    with open(fd, "rb") as f:
        want = size - start if length is None else length
        check_size(want, limit, path)
        if start + want > size:
            raise Permanent(f"range {start}+{length} goes past the end of {path} ({size} bytes)")
        if start:
            f.seek(start)
        data = f.read(want + 1 if length is None else want)
    if len(data) != want:
        raise Transient(
            f"{path} changed size while read: {size} bytes by fstat, "
            f"{'more' if len(data) > want else 'fewer'} read from offset {start}"
        )
    return data


def _chunk_sync(path: str, start: int, length: int) -> bytes:
    """Up to ``length`` bytes of regular file ``path`` from ``start``."""
    fd, _ = _open_regular(path)
    with open(fd, "rb") as f:
        f.seek(start)
        return f.read(length)


_read = aiofiles.os.wrap(_read_sync)
_read_chunk = aiofiles.os.wrap(_chunk_sync)


class FileClient:
    """Reads local files (the :class:`Client` of file sources).

    Args:
        max_object_size: Largest file (or range) accepted, in bytes; None: no limit.
    """

    def __init__(self, max_object_size: int | None) -> None:
        self.max_object_size = max_object_size
        self.redact = Redactor()

    @staticmethod
    def shown(target: str) -> str:
        return target.removeprefix("file://")

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        """The file (``length`` None: from ``start`` to its end) or the range; see the module's
        docstring for what is refused and when a read fails as transient."""
        data: bytes = await _read(self.shown(target), start or 0, length, self.max_object_size)
        return data

    async def stream(
        self, target: str, start: int, pin: dict[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        path, pos = self.shown(target), start
        while chunk := await _read_chunk(path, pos, _CHUNK):
            pos += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        """Nothing to close: files are opened and closed per read."""

    def __repr__(self) -> str:
        return "FileClient()"


def list_files(root: str | os.PathLike[str]) -> list[str]:
    """The files under directory ``root``, recursively, sorted by path."""
    return sorted(str(p) for p in Path(root).rglob("*") if p.is_file())


class FileSource(RemoteMap):
    """An async map-style source: item ``i`` is the bytes of ``paths[i]`` (or ``decode(bytes)``).

    Args:
        paths: File paths, or ``(path, offset, length)`` tuples for ranged reads, or one
            directory, whose files (recursively) become the items in sorted order.
        retry: As for :class:`HTTPSource`; local errors are permanent, so it rarely applies.
        decode: ``fn(bytes) -> sample``, run on the event loop.
        on_error: ``"raise"`` (default) or ``"skip"`` (see :class:`HTTPSource`).
        max_skipped: The most items to skip with ``on_error="skip"``.
        max_object_size: Largest file accepted, in bytes (default 256 MiB); None: no limit.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str] | tuple[str, int, int]] | str | os.PathLike[str],
        /,
        *,
        retry: Retry | None = None,
        decode: Callable[[bytes], Any] | None = None,
        on_error: str = "raise",
        max_skipped: int | None = None,
        max_object_size: int | None = DEFAULT_MAX_OBJECT_SIZE,
    ) -> None:
        retry = check_common(retry, max_object_size, decode)
        if isinstance(paths, str | os.PathLike):
            if not os.path.isdir(paths):
                raise ValueError(f"{os.fspath(paths)!r} is not a directory; pass a list of files")
            paths = list_files(paths)
        items = parse_items(paths, "paths")
        super().__init__(
            items,
            FileClient(max_object_size),
            decode=decode,
            retry=retry,
            on_error=on_error,
            max_skipped=max_skipped,
        )
