"""Waiting for processes to exit, on the exit itself (Linux pidfds), whoever reaps them."""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Iterable

import psutil


class Exits:
    """Pidfds of processes, opened while they run: each becomes readable once its process has
    exited, whoever its parent is.

    ``psutil.wait_procs`` would do for children; orphans are reparented to PID 1, which
    reaps them when it gets to it (here, up to a second later), and until then psutil sees
    a zombie as alive.
    """

    def __init__(self, procs: Iterable[psutil.Process]) -> None:
        self._fds: dict[int, int] = {}
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                self._fds[proc.pid] = os.pidfd_open(proc.pid)

    def wait(self, timeout: float) -> set[int]:
        """Waits until all have exited or ``timeout`` seconds have passed; returns the pids
        still running."""
        deadline = time.monotonic() + timeout
        waiting = dict(self._fds)
        while waiting:
            left = deadline - time.monotonic()
            ready = select.select(list(waiting.values()), [], [], max(0.0, left))[0]
            if not ready:
                break
            waiting = {pid: fd for pid, fd in waiting.items() if fd not in ready}
        return set(waiting)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
