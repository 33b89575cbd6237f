"""The entries a running epoch still needs, as its processes declare them.

A :class:`Pins` belongs to one source's client in one process: a sharded source declares the
shards of its epoch's plan (:meth:`Pins.plan`) and each is crossed off when its read ends
(:meth:`Pins.done`). They are written to ``pins/<pid>-<rand>``, which the process holds
(shared lock) while it lives: eviction reads the files of live processes
(:func:`needed`), removes those of dead ones, and evicts these entries last.

Pins order eviction; they guarantee nothing. A file read while it is rewritten may list a
few keys too many or too few.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from asyncloader.sources._cache.locks import try_lock


class Pins:
    """The keys one reader still needs, kept in its own file (made on first use, and again
    in a forked child: a copy never writes its parent's).

    Nothing waits on a pin: eviction only orders by them (never blocks), and a dead
    process's file is removed by the first eviction that finds its lock free."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._keys: set[str] = set()
        self._pid = 0
        self._fd = -1
        self._close: weakref.finalize[..., Any] | None = None

    def plan(self, keys: Iterable[str]) -> None:
        """The keys of a new plan (the previous plan's are dropped)."""
        self._keys = set(keys)
        self._write()

    def done(self, key: str) -> None:
        if key in self._keys:
            self._keys.discard(key)
            self._write()

    def _write(self) -> None:
        if self._pid != os.getpid():
            self._open()
        data = "".join(f"{key}\n" for key in sorted(self._keys)).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def _open(self) -> None:
        if self._close is not None:  # a forked child's copy: its parent's file stays
            self._close.detach()
            os.close(self._fd)
        self._pid = os.getpid()
        path = self._folder / f"{self._pid}-{os.urandom(4).hex()}"
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try_lock(self._fd, shared=True)
        self._close = weakref.finalize(self, _remove, self._fd, path, self._pid)

    def __getstate__(self) -> dict[str, Path]:
        return {"folder": self._folder}

    def __setstate__(self, state: dict[str, Path]) -> None:
        self.__init__(state["folder"])  # type: ignore[misc]


def _remove(fd: int, path: Path, pid: int) -> None:
    if os.getpid() == pid:
        os.close(fd)
        path.unlink(missing_ok=True)


def needed(folder: Path) -> set[str]:
    """The keys that live processes' running epochs still need; removes dead ones' files."""
    keys: set[str] = set()
    for path in folder.iterdir():
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            continue
        try:
            if try_lock(fd):  # no one holds it: its process is gone
                path.unlink(missing_ok=True)
                continue
            keys.update(os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace").split())
        finally:
            os.close(fd)
    return keys
