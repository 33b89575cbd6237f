"""The cache's file locks (``flock``: held per open file, released by the kernel when the
process holding it dies, so a killed downloader never leaves an entry locked).

- **Download lock** (``locks/ab/<key>``, exclusive): held while one process fetches an entry;
  the node's other processes wait for it, then read what it wrote. Waiting polls (doubling
  from 1 ms to ``POLL_MAX_S``) on the event loop, never in a thread: a thread blocked on a
  lock that a download of this very loop holds could starve the loop's executor.
- **In use** (shared, on an entry's own file): held by every reader, and by a writer from the
  file's creation; eviction takes it exclusively without waiting, and skips the entry when
  it cannot.
- **Cache-wide** (``lock``, exclusive): the byte count and eviction, held briefly, by code
  that waits for nothing else; taken blocking, off the loop.

A lock file may be removed (an evicted entry's) while another process waits on it: a lock
counts only when the file locked is still the one at its path (:func:`_current`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

POLL_MIN_S = 0.001
POLL_MAX_S = 0.05
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def try_lock(fd: int, shared: bool = False) -> bool:
    """Takes ``fd``'s lock without waiting; False when another open file holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one removed meanwhile)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _open_current(path: Path) -> int | None:
    """``path`` opened and locked exclusively, when no one holds it; else None."""
    fd = os.open(path, _FLAGS, 0o644)
    if try_lock(fd) and _current(fd, path):
        return fd
    os.close(fd)
    return None


@contextlib.asynccontextmanager
async def download_lock(path: Path) -> AsyncIterator[bool]:
    """Holds ``path`` exclusively for the block; yields whether it had to wait (another
    process, or task, was downloading).

    Liveness: while a download holds the lock, its waiters poll (at most ``POLL_MAX_S``
    apart); the holder's ``finally`` closes its fd on every exit (error, cancellation) and
    the kernel releases a dead process's, so a waiter takes the lock within one poll of
    the release. A lock file removed meanwhile is not held (:func:`_current`): the waiter
    opens the new one. Nothing waits for another lock while holding this one."""
    waited, delay = False, POLL_MIN_S
    while (fd := _open_current(path)) is None:
        waited = True
        await asyncio.sleep(delay)
        delay = min(2 * delay, POLL_MAX_S)
    try:
        yield waited
    finally:
        os.close(fd)


def try_download_lock(path: Path) -> int | None:
    """The download lock of ``path`` without waiting (eviction's): its fd, or None."""
    try:
        return _open_current(path)
    except FileNotFoundError:  # its folder is gone: no one holds it
        return None


def remove_lock_file(path: Path) -> None:
    """Removes the download lock file ``path`` when no one holds or waits on it now (a waiter
    that opened it before finds it gone, and opens the new one)."""
    fd = try_download_lock(path)
    if fd is not None:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Holds the cache-wide lock ``path``, waiting for it (off the event loop)."""
    fd = os.open(path, _FLAGS, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
