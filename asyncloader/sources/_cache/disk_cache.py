"""DiskCache: the public object, and the operations a cached client runs on it.

Each operation that touches files is a plain function run off the event loop (the caller's
executor); waiting for another process's download (:func:`.locks.download_lock`) is the one
wait on the loop.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncloader.sources._cache.entries import (
    EntryFile,
    Invalid,
    Partial,
    encode_meta,
    open_entry,
    remove_dead_temps,
)
from asyncloader.sources._cache.eviction import evict, read_usage, write_usage
from asyncloader.sources._cache.layout import Layout
from asyncloader.sources._cache.locks import cache_lock, download_lock
from asyncloader.sources._cache.pins import Pins
from asyncloader.sources._cache.stats import CacheStats, SharedCounters, report, totals

log = logging.getLogger("asyncloader.sources")

# One row of counters per directory per process, whichever DiskCache objects use it.
_counters: dict[Path, SharedCounters] = {}
_counters_lock = threading.Lock()


def _counters_of(layout: Layout) -> SharedCounters:
    with _counters_lock:
        root = layout.root.resolve()
        if root not in _counters:
            _counters[root] = SharedCounters(layout.stats, layout.slots)
        return _counters[root]


class DiskCache:
    """Remote objects and shards kept in a local directory, shared by every process of the
    node: pass it as ``cache=`` to :class:`HTTPSource`, :class:`ObjectStoreSource` or
    :class:`ShardedSource`.

    A read is served from the cache when its entry is there and valid, with no request to
    the store; otherwise it is fetched and written through. One process downloads an entry
    while the node's others wait for it, then read it (file locks; a dead downloader's are
    released by the kernel). See docs/sources.md, "Disk cache".

    Args:
        path: The cache's directory, made if missing; give every process of a node (ranks,
            workers) the same one.
        max_bytes: The most bytes to hold; beyond it, entries are evicted, least recently
            used first, those a running epoch still needs last, those in use never.

    Raises:
        TypeError: ``path`` is not a str or path, or ``max_bytes`` not an int.
        ValueError: ``max_bytes < 1``, or ``path`` is not a directory (or another layout's).
    """

    def __init__(self, path: str | os.PathLike[str], /, *, max_bytes: int) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__qualname__}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"max_bytes must be an int, got {type(max_bytes).__qualname__}")
        if max_bytes < 1:
            raise ValueError(f"{max_bytes=} must be >= 1")
        self.path = Path(os.fspath(path)).absolute()
        self.max_bytes = max_bytes
        self._layout = Layout(self.path)
        self._layout.create()
        self._baseline = totals(self._layout.stats)

    @property
    def stats(self) -> CacheStats:
        """Hits, misses, bytes and evictions of every process using this directory, since
        this object was made (see :class:`CacheStats`)."""
        now = totals(self._layout.stats)
        counted = {name: now[name] - self._baseline.get(name, 0) for name in now}
        return replace(CacheStats(**counted), stored_bytes=read_usage(self._layout.usage))

    def report(self) -> str:
        """What the cache holds and did, in a few lines (:attr:`stats` in words)."""
        return report(str(self.path), self.max_bytes, self.stats)

    def __repr__(self) -> str:
        return f"DiskCache({str(self.path)!r}, max_bytes={self.max_bytes})"

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "max_bytes": self.max_bytes, "baseline": self._baseline}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.max_bytes = state["path"], state["max_bytes"]
        self._layout = Layout(self.path)
        self._baseline = state["baseline"]

    # What a cached client runs: blocking file work (off the loop) and the download lock.

    def count(self, **counts: int) -> None:
        _counters_of(self._layout).add(**counts)

    def pins(self) -> Pins:
        return Pins(self._layout.pins)

    def open(self, key: str, load: bool) -> EntryFile | bytes | Invalid | None:
        """The entry ``key`` validated (see :func:`.entries.open_entry`)."""
        return open_entry(self._layout.entry(key), load)

    def downloading(self, key: str) -> Any:
        """``async with`` it: this process alone downloads ``key`` on the node meanwhile;
        yields whether it waited for another download first."""
        return download_lock(self._layout.download_lock(key))

    def drop(self, key: str, reason: Invalid, shown: str) -> None:
        """Removes an invalid entry (the caller holds its download lock) and says so."""
        self._layout.entry(key).unlink(missing_ok=True)
        self.count(dropped=1)
        log.warning("disk cache: dropped %s (%s); fetching it again", shown, reason.reason)

    def start(self, key: str) -> Partial:
        """A new temporary file for ``key`` (the caller holds its download lock), after
        removing those dead writers left."""
        remove_dead_temps(self._layout.temps_of(key))
        return Partial(self._layout.temp(key))

    def finish(self, key: str, part: Partial, meta: dict[str, Any]) -> EntryFile:
        """Makes ``part`` the entry ``key`` (open, in use), counted, evicting others if the
        cache is over ``max_bytes``; an object larger than ``max_bytes`` is served from its
        file but never becomes an entry."""
        if part.written + len(encode_meta(meta)) > self.max_bytes:
            return part.unlinked()
        size = part.seal(meta)
        with cache_lock(self._layout.lock):
            usage = read_usage(self._layout.usage) + size
            write_usage(self._layout.usage, usage)
            entry = part.rename(self._layout.entry(key))
            if usage > self.max_bytes:
                _, evicted, freed = evict(self._layout, self.max_bytes)
                self.count(evictions=evicted, bytes_evicted=freed)
        return entry

    def store(self, key: str, data: bytes, meta: dict[str, Any]) -> None:
        """Writes ``data`` as the entry ``key`` (see :meth:`finish`)."""
        part = self.start(key)
        try:
            part.write(data)
            self.finish(key, part, meta).close()
        finally:
            part.discard()
