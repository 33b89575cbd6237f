"""Runs one command as the child of a subreaper and reports what outlived it.

Usage: ``python supervise.py REPORT GRACE_S -- COMMAND...``

The command runs in a session of its own, with this process's stdin, stdout and stderr. As
a child subreaper (``PR_SET_CHILD_SUBREAPER``), this process inherits every process the
command leaves behind, in whatever session it put them (a Jupyter kernel starts its own), so
it sees all of them and reaps them. Once the command has exited, it waits up to GRACE_S
seconds for those to exit (on pidfds), then kills and reaps what is left, and writes REPORT
(JSON): the command's pid and return code, when it exited and when the last of its
descendants did (``time.monotonic()``, the same clock in every process), and the processes
still running at the deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36


def live_descendants() -> list[psutil.Process]:
    """This process's descendants that have not exited (zombies excluded)."""
    live = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc)
    return live


def reap() -> None:
    """Reaps every child that has exited."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
    return out


def wait_descendants(deadline: float) -> tuple[float, list[psutil.Process]]:
    """Waits until no descendant runs or ``deadline`` passes; returns when the last one was
    seen to exit (now, if none ran) and those still running."""
    last = time.monotonic()
    while True:
        reap()
        live = live_descendants()
        if not live:
            return last, []
        left = deadline - time.monotonic()
        if left <= 0:
            return last, live
        fds = []
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(proc.pid))
        try:
            if select.select(fds, [], [], left)[0]:
                last = time.monotonic()
        finally:
            for fd in fds:
                os.close(fd)


def kill_and_reap() -> None:
    """SIGKILLs every descendant still running and reaps every child, those the kills
    orphan included, until none is left."""
    while True:
        for proc in live_descendants():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main() -> None:
    report_path, grace, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: supervise.py REPORT GRACE_S -- COMMAND..."
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    proc = subprocess.Popen(command, start_new_session=True)
    rc = proc.wait()
    exited = time.monotonic()
    at_exit = describe(live_descendants())
    last, left = wait_descendants(exited + float(grace))
    kill_and_reap()
    report = {
        "pid": proc.pid,
        "rc": rc,
        "exited": exited,
        "running_at_exit": at_exit,
        "last_descendant_exit": last,
        "left": describe(left),
    }
    with open(report_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
