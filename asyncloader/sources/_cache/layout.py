"""Where a cache directory keeps each file, and the key that names an entry.

::

    <path>/
      ASYNCLOADER_CACHE      marks the directory as a cache (and its layout version)
      lock                   the cache-wide lock: the byte count and eviction
      usage                  the bytes of entries held, as counted at writes and evictions
      stats                  the node's counters (see :mod:`.stats`), stats.slots/ their owners
      data/ab/<key>          entries: the object's bytes, then its metadata (see :mod:`.entries`)
      locks/ab/<key>         held while the entry is downloaded (one download per node)
      tmp/<key>.<pid>.<rand> entries being written; renamed into data/ when whole
      pins/<pid>-<rand>      the entries each running epoch still needs (see :mod:`.pins`)

A key is the SHA-256 of the full URL (credentials included, so that two users' objects never
share an entry) with the range read and the store's endpoint: no file name holds a
credential, and the metadata shows the URL redacted only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MARKER = "ASYNCLOADER_CACHE"
VERSION = "1"


def entry_key(namespace: str, target: str, start: int | None, length: int | None) -> str:
    """The key of ``target`` (its bytes ``[start, start + length)``, or all of it when None)
    read through a client of ``namespace`` (a store's endpoint; empty for URLs)."""
    text = "\0".join((namespace, target, str(start), str(length)))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class Layout:
    """The paths of one cache directory; creates the directories it hands out."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.locks = root / "locks"
        self.tmp = root / "tmp"
        self.pins = root / "pins"
        self.lock = root / "lock"
        self.usage = root / "usage"
        self.stats = root / "stats"
        self.slots = root / "stats.slots"
        self._made: set[Path] = set()

    def create(self) -> None:
        """Makes the directory and its folders (and marks it) unless they exist.

        Raises:
            ValueError: ``root`` exists and is not a directory, or holds another layout.
        """
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"path {str(self.root)!r} exists and is not a directory")
        for folder in (self.data, self.locks, self.tmp, self.pins, self.slots):
            folder.mkdir(parents=True, exist_ok=True)
        marker = self.root / MARKER
        if not marker.exists():  # written whole: another process may be reading it
            temp = self.temp(MARKER)
            temp.write_text(VERSION)
            temp.replace(marker)
        elif marker.read_text().strip() != VERSION:
            raise ValueError(f"path {str(self.root)!r} holds a cache of another layout version")

    def _folder(self, base: Path, key: str) -> Path:
        folder = base / key[:2]
        if folder not in self._made:
            folder.mkdir(exist_ok=True)
            self._made.add(folder)
        return folder

    def entry(self, key: str) -> Path:
        return self._folder(self.data, key) / key

    def download_lock(self, key: str) -> Path:
        return self._folder(self.locks, key) / key

    def temp(self, key: str) -> Path:
        return self.tmp / f"{key}.{os.getpid()}.{os.urandom(4).hex()}"

    def temps_of(self, key: str) -> list[Path]:
        """The temporary files of ``key`` (live writers' and dead ones')."""
        return sorted(self.tmp.glob(f"{key}.*"))

    def __getstate__(self) -> dict[str, Path]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, Path]) -> None:
        self.__init__(state["root"])  # type: ignore[misc]
