"""Start-up and identity of an asyncloader worker process.

:func:`init_worker` is the initializer of each pool process: it takes the next worker id, seeds
the RNGs, keeps the :class:`~asyncloader._worker.plan.BatchPlan` it was sent once, and calls the
user's ``worker_init_fn``. Each worker also writes which batch it is running into an array
shared with the parent (:class:`Running`), so a crash can be reported with the batch it held.
"""

from __future__ import annotations

import os
import signal
import traceback
from typing import TYPE_CHECKING, Any

import torch

from asyncloader._base.compat import set_torch_worker_info
from asyncloader._base.failure import Failure
from asyncloader._base.seeding import leave_seeding_to_user, rng_states, seed_all
from asyncloader._base.worker_info import WorkerInfo, get_worker_info, set_worker_info
from asyncloader._worker.allocator import keep_freed_memory
from asyncloader._worker.buffers import set_pool_slots
from asyncloader._worker.orphans import watch_parent

if TYPE_CHECKING:
    from asyncloader._worker.plan import BatchPlan


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


_plan: BatchPlan | None = None
_running: Running | None = None
_init_failure: Failure | None = None  # what worker_init_fn raised, answered to every task
_sharing = True  # batches leave through shared memory (see shares_batches)


def worker_plan() -> BatchPlan | None:
    """The plan this worker process was started with (``None`` outside a worker)."""
    return _plan


def mark_running(seq: int) -> None:
    """Records that this worker runs batch ``seq`` (``-1``: none); a no-op outside a worker."""
    info = get_worker_info()
    if _running is not None and info is not None:
        _running.set(info.id, seq)


def init_worker(
    owner_pid: int,
    counter: Any,
    running: Running,
    num_workers: int,
    base_seed: int,
    plan: BatchPlan,
    worker_init_fn: Any,
) -> None:
    """Initializer of each pool process: takes the next id from ``counter``, registers in
    ``running``, then :func:`setup_worker`."""
    global _running
    with counter.get_lock():
        worker_id = counter.value
        counter.value += 1
    _running = running
    running.register(worker_id, os.getpid())
    setup_worker(owner_pid, worker_id, num_workers, base_seed, plan, worker_init_fn)


def setup_worker(
    owner_pid: int | None,
    worker_id: int,
    num_workers: int,
    base_seed: int,
    plan: BatchPlan,
    worker_init_fn: Any,
    share_batches: bool = True,
) -> None:
    """Makes this process worker ``worker_id``: seeds, keeps the plan, calls the hook.

    First of all it makes the worker exit once ``owner_pid`` (the training process) has exited
    (:mod:`asyncloader._worker.orphans`; ``None``: the worker's lifetime is someone else's, a Ray
    actor's). It also makes malloc keep a batch's freed samples for the next batch
    (:func:`asyncloader._worker.allocator.keep_freed_memory`).
    """
    global _plan, _init_failure, _sharing
    if owner_pid is not None:
        watch_parent(owner_pid)
        # Ctrl-C is the training process's to handle (it stops the workers), as DataLoader's
        # workers leave it: a KeyboardInterrupt here would come back as a batch's error.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _sharing = share_batches
    seed = base_seed + worker_id
    torch.set_num_threads(1)
    keep_freed_memory()
    seed_all(seed)
    _plan = plan
    set_pool_slots(plan.buffers if share_batches else 0)
    set_worker_info(WorkerInfo(worker_id, num_workers, seed, plan.dataset))
    set_torch_worker_info(worker_id, num_workers, seed, plan.dataset)
    if worker_init_fn is not None:
        try:
            before = rng_states()
            worker_init_fn(worker_id)
            if rng_states() != before:
                leave_seeding_to_user()
        except Exception as exc:
            # Kept, not raised: an initializer that raises breaks the whole executor and the
            # user's exception is lost. Every task this worker gets answers with it instead.
            exc.add_note(f"asyncloader: stage=worker_init worker={worker_id}")
            _init_failure = Failure(exc, "".join(traceback.format_exception(exc)))


def init_failure() -> Failure | None:
    """What this worker's ``worker_init_fn`` raised (``None``: nothing, or not a worker).

    Also the task :meth:`ProcessPool.start` sends each worker, to start it and hear of it."""
    return _init_failure


def shares_batches() -> bool:
    """A batch made here leaves through shared memory (a worker process of this machine's
    pool; a Ray actor returns it through Ray's object store instead)."""
    return get_worker_info() is not None and _sharing
