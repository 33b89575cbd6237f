"""What this worker process holds once started: which batch it runs, what its
``worker_init_fn`` raised, and whether its batches leave through shared memory.

A leaf: it imports nothing of :mod:`asyncloader._worker` but what it shares with every module,
so :mod:`~asyncloader._worker.startup` (which sets it), :mod:`~asyncloader._worker.plan` and
:mod:`~asyncloader._worker.collate` (which read it) import it without a circle.
"""

from __future__ import annotations

from typing import Any

from asyncloader._base import Failure, get_worker_info


class Running:
    """``[pid, seq]`` per worker id in an array shared with the parent: which batch each worker
    is running (``-1``: none). Written by the workers, read by the parent after a crash."""

    def __init__(self, array: Any) -> None:
        self.array = array

    @classmethod
    def allocate(cls, ctx: Any, num_workers: int) -> Running:
        return cls(ctx.Array("q", 2 * num_workers, lock=False))

    def register(self, worker_id: int, pid: int) -> None:
        self.array[2 * worker_id], self.array[2 * worker_id + 1] = pid, -1

    def set(self, worker_id: int, seq: int) -> None:
        self.array[2 * worker_id + 1] = seq

    def by_pid(self) -> dict[int, int]:
        """pid -> seq of the batch it runs (``-1``: none)."""
        a = self.array
        return {a[2 * i]: a[2 * i + 1] for i in range(len(a) // 2)}


_running: Running | None = None
_init_failure: Failure | None = None  # what worker_init_fn raised, answered to every task
_sharing = True  # batches leave through shared memory (see shares_batches)


def keep_running(running: Running) -> None:
    """This worker reports the batch it runs in ``running`` (see :func:`mark_running`)."""
    global _running
    _running = running


def keep_init_failure(failure: Failure | None) -> None:
    """What this worker's ``worker_init_fn`` raised, answered to every task."""
    global _init_failure
    _init_failure = failure


def keep_sharing(share_batches: bool) -> None:
    """Whether this worker's batches leave through shared memory (see :func:`shares_batches`)."""
    global _sharing
    _sharing = share_batches


def mark_running(seq: int) -> None:
    """Records that this worker runs batch ``seq`` (``-1``: none); a no-op outside a worker."""
    info = get_worker_info()
    if _running is not None and info is not None:
        _running.set(info.id, seq)


def init_failure() -> Failure | None:
    """What this worker's ``worker_init_fn`` raised (``None``: nothing, or not a worker).

    Also the task :meth:`ProcessPool.start` sends each worker, to start it and hear of it."""
    return _init_failure


def shares_batches() -> bool:
    """A batch made here leaves through shared memory (a worker process of this machine's
    pool; a Ray actor returns it through Ray's object store instead)."""
    return get_worker_info() is not None and _sharing
