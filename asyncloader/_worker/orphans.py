"""Worker processes never outlive the process that started them.

However the training process ends (an exception, ``SIGKILL``, ``SIGTERM``, ``os._exit`` in a
``multiprocessing`` child that skips every finaliser), its workers exit within moments:

- a daemon thread in each worker, ``asyncloader-watchdog``, waits on a pidfd of the training
  process (Linux 5.3+: readable once that process has exited, no polling) and ends the worker
  with ``os._exit``; elsewhere it checks, once a second, whether the process is still alive;
- on Linux, when the worker's parent is the fork server (whose main thread forked it, and which
  exits when the training process does), ``PR_SET_PDEATHSIG`` also kills the worker with
  ``SIGKILL`` when the fork server goes, even if the worker's interpreter is stuck holding the
  GIL. It is not set when the training process forked the worker itself: the signal follows
  the *thread* that forked, and asyncloader may fork from a short-lived thread.

A worker that exits this way leaves nothing behind: its shared-memory segments are unlinked
already (torch's file-descriptor sharing) and the training process's resource tracker removes
the pool's named semaphores.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0


def watch_parent(owner_pid: int) -> None:
    """Makes this (worker) process exit when process ``owner_pid`` has exited."""
    if sys.platform == "linux" and os.getppid() != owner_pid:
        _die_with_parent()
    if os.getppid() != owner_pid and not _alive(owner_pid):
        os._exit(0)
    thread = threading.Thread(
        target=_watch, args=(owner_pid,), name="asyncloader-watchdog", daemon=True
    )
    thread.start()


def _watch(owner_pid: int) -> None:
    try:
        fd = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or the process is already gone
        fd = None
    if fd is not None:
        select.select([fd], [], [])
    else:
        stop = threading.Event()
        while _alive(owner_pid):
            stop.wait(_POLL_S)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
