"""The bytes a cache holds, and eviction of the least recently used entries beyond its limit.

``usage`` counts the bytes of the entries (metadata included), added to as each is written,
under the cache-wide lock. Past ``max_bytes``, eviction lists the entries (the count may
drift when a process dies between a write and its count; the listing sets it right) and
removes them until they hold at most ``LOW_WATER`` of ``max_bytes`` (so that a full cache is
not listed at each write), in this order: entries no running epoch still needs
(:mod:`.pins`), least recently used first (an entry's mtime is its last use), then the
others, likewise. An entry in use (:mod:`.entries`) is never evicted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from asyncloader.sources._cache.entries import remove_dead_temps
from asyncloader.sources._cache.layout import Layout
from asyncloader.sources._cache.locks import remove_lock_file, try_download_lock, try_lock
from asyncloader.sources._cache.pins import needed

LOW_WATER = 0.9


_DIGITS = 20


def read_usage(path: Path) -> int:
    try:
        return int(path.read_bytes() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_usage(path: Path, value: int) -> None:
    """Writes the count in place, all its digits in one write (a reader never sees it
    emptied, as a truncation would leave it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"%0*d" % (_DIGITS, max(0, value)), 0)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Found:
    key: str
    path: Path
    size: int
    used: float


def _listing(data: Path) -> list[_Found]:
    found = []
    for folder in os.scandir(data):
        for entry in os.scandir(folder.path):
            try:
                info = entry.stat()
            except FileNotFoundError:
                continue
            found.append(_Found(entry.name, Path(entry.path), info.st_size, info.st_mtime))
    return found


def _remove_unused(path: Path) -> bool:
    """Removes the entry at ``path`` unless it is in use (or replaced meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        if not try_lock(fd) or os.stat(path).st_ino != os.fstat(fd).st_ino:
            return False
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def evict(layout: Layout, max_bytes: int) -> tuple[int, int, int]:
    """Evicts down to ``LOW_WATER * max_bytes`` (the caller holds the cache-wide lock).

    Returns:
        ``(bytes held now, entries evicted, their bytes)``.
    """
    found = _listing(layout.data)
    total = sum(f.size for f in found)
    evicted = freed = 0
    if total > max_bytes:
        keep = needed(layout.pins)
        for f in sorted(found, key=lambda f: (f.key in keep, f.used)):
            if total - freed <= LOW_WATER * max_bytes:
                break
            if _remove_unused(f.path):
                evicted, freed = evicted + 1, freed + f.size
                remove_lock_file(layout.locks / f.key[:2] / f.key)
        _remove_stale_temps(layout)
    write_usage(layout.usage, total - freed)
    return total - freed, evicted, freed


def _remove_stale_temps(layout: Layout) -> None:
    """Removes temporary files that dead writers left, each under its key's download lock."""
    for key in {path.name.partition(".")[0] for path in layout.tmp.iterdir()}:
        fd = try_download_lock(layout.locks / key[:2] / key)
        if fd is not None:
            try:
                remove_dead_temps(layout.temps_of(key))
            finally:
                os.close(fd)
