"""FileSource: item ``i`` is the bytes of a local file, read with aiofiles.

aiofiles runs the blocking calls in the loop's default thread pool, so many files are read at
once without blocking the loop. Each read (open, seek, read, close) is one call there, made
async by ``aiofiles.os.wrap``: a cancelled fetch (a sibling in its batch failed) then cannot
leave a file open, as it can when cancellation lands between ``aiofiles.open`` and its close;
and it costs one thread hop instead of four. Local errors (a missing file, a permission
refused) are permanent: they fail at the first attempt.
"""

from __future__ import annotations

import os
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
from asyncloader.sources._retry import Permanent, Retry, check_size

_CHUNK = 1 << 20


def _read_sync(path: str, start: int, length: int) -> bytes:
    """``length`` bytes (-1: all) of ``path`` from ``start``; the file is closed on return."""
    with open(path, "rb") as f:
        if start:
            f.seek(start)
        return f.read(length)


_read = aiofiles.os.wrap(_read_sync)


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
        path = self.shown(target)
        size = (await aiofiles.os.stat(path)).st_size
        first = start or 0
        check_size(size - first if length is None else length, self.max_object_size, path)
        data = await _read(path, first, -1 if length is None else length)
        if length is not None and len(data) != length:
            raise Permanent(f"range {first}+{length} goes past the end of {path} ({size} bytes)")
        return data

    async def stream(
        self, target: str, start: int, pin: dict[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        path, pos = self.shown(target), start
        while chunk := await _read(path, pos, _CHUNK):
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
        retry = retry or Retry()
        check_common(retry, max_object_size, decode)
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
