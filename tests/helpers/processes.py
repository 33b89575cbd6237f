"""Waiting for processes to exit, on the exit itself (Linux pidfds), whoever reaps them."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
import uuid
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


#: The environment variable that marks every process of a job (inherited by all it starts).
JOB_MARKER = "ASYNCLOADER_TEST_JOB"


def marked(marker: str) -> list[psutil.Process]:
    """Processes whose environment carries ``marker`` (a job's, inherited by every child)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            if proc.environ().get(JOB_MARKER) == marker:
                found.append(proc)
    return found


def run_job(
    command: list[str], env: dict[str, str], cwd: object, *, timeout: float, grace: float
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` in a session of its own, marked with a new :data:`JOB_MARKER`; kills
    its process group only if it is still running at ``timeout``. Every process the job
    started (its workers, whoever reaps them) must then exit within ``grace`` seconds."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        command, env={**env, JOB_MARKER: marker}, cwd=cwd, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = marked(marker)
    exits = Exits(left)
    try:
        assert not exits.wait(grace), f"processes of the job outlived it: {left}"
    finally:
        exits.close()
    return subprocess.CompletedProcess(command, proc.returncode, out)
