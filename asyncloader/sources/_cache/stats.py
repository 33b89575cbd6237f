"""Counters of a cache directory, shared by every process that uses it.

The file ``stats`` holds ``SLOTS`` rows of counters; each process adds to a row of its own,
which it holds (``stats.slots/<row>``, exclusive lock) while it lives, so no two processes
write the same row and no write needs a lock between processes. A row outlives its process,
and the next process to take it adds on: the sum of the rows only grows. A
:class:`~asyncloader.sources.DiskCache` reports the sums less those when it was made.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from dataclasses import dataclass, fields
from pathlib import Path

from asyncloader.sources._cache.locks import try_lock

SLOTS = 256


@dataclass(frozen=True)
class CacheStats:
    """What a :class:`~asyncloader.sources.DiskCache` did, summed over the processes that
    used its directory (a node's ranks and their workers) since the object was made.

    Attributes:
        hits: Reads served from the cache (no request to the store).
        misses: Reads fetched from the store and written to the cache.
        waits: Hits that first waited for another process's (or task's) download.
        bytes_hit: Bytes served from the cache.
        bytes_fetched: Bytes fetched from the store into the cache.
        evictions: Entries evicted to stay within ``max_bytes``.
        bytes_evicted: Bytes of those entries.
        dropped: Entries found truncated or corrupted, removed and fetched again.
        stored_bytes: Bytes the cache holds now (all processes', as counted at writes and
            evictions; metadata included).
    """

    hits: int = 0
    misses: int = 0
    waits: int = 0
    bytes_hit: int = 0
    bytes_fetched: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    dropped: int = 0
    stored_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / (hits + misses)``; 0.0 before any read."""
        reads = self.hits + self.misses
        return self.hits / reads if reads else 0.0


COUNTERS = tuple(f.name for f in fields(CacheStats) if f.name != "stored_bytes")
_ROW = struct.Struct(f"<{len(COUNTERS)}q")
_SIZE = SLOTS * _ROW.size


class SharedCounters:
    """This process's row of the counters file ``path`` (taken on first use, and again in a
    forked child)."""

    def __init__(self, path: Path, slots: Path) -> None:
        self._path, self._slots = path, slots
        self._lock = threading.Lock()
        self._pid = 0
        self._row: mmap.mmap | bytearray = bytearray(_ROW.size)
        self._offset = 0
        self._held = -1

    def add(self, **counts: int) -> None:
        """Adds to this process's row (names of :data:`COUNTERS`)."""
        with self._lock:
            if self._pid != os.getpid():
                self._take_row()
            values = list(_ROW.unpack_from(self._row, self._offset))
            for name, n in counts.items():
                values[COUNTERS.index(name)] += n
            _ROW.pack_into(self._row, self._offset, *values)

    def _take_row(self) -> None:
        if self._held >= 0:  # a forked child's copy of its parent's lock: the parent keeps it
            os.close(self._held)
        self._pid, self._held = os.getpid(), -1
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            shared = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        for slot in range(SLOTS):
            held = os.open(self._slots / str(slot), os.O_RDWR | os.O_CREAT, 0o644)
            if try_lock(held):
                self._row, self._offset, self._held = shared, slot * _ROW.size, held
                return
            os.close(held)
        shared.close()  # every row taken: this process counts for itself only
        self._row, self._offset = bytearray(_ROW.size), 0


def totals(path: Path) -> dict[str, int]:
    """The sums of every row of the counters file ``path`` (zeros when it has none)."""
    sums = dict.fromkeys(COUNTERS, 0)
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        data = f.read(_SIZE)
        for offset in range(0, len(data) - _ROW.size + 1, _ROW.size):
            for name, value in zip(COUNTERS, _ROW.unpack_from(data, offset), strict=True):
                sums[name] += value
    return sums


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def report(where: str, max_bytes: int, stats: CacheStats) -> str:
    """Lines that say what the cache holds and did."""
    return "\n".join(
        [
            f"disk cache {where}: {_size(stats.stored_bytes)} of {_size(max_bytes)}",
            f"  hits {stats.hits} ({_size(stats.bytes_hit)}; {stats.waits} after waiting for "
            f"another download), misses {stats.misses} ({_size(stats.bytes_fetched)} "
            f"fetched): hit rate {stats.hit_rate:.0%}",
            f"  evictions {stats.evictions} ({_size(stats.bytes_evicted)}), invalid entries "
            f"dropped and fetched again {stats.dropped}",
        ]
    )
