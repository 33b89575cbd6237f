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
from typing import Any

import torch

from asyncloader._base import (
    Failure,
    WorkerInfo,
    leave_seeding_to_user,
    rng_states,
    seed_all,
    set_torch_worker_info,
    set_worker_info,
)
from asyncloader._worker.allocator import keep_freed_memory
from asyncloader._worker.buffers import set_pool_slots
from asyncloader._worker.orphans import watch_parent
from asyncloader._worker.plan import BatchPlan, keep_plan
from asyncloader._worker.process_state import (
    Running as Running,  # the name the local engine imports
)
from asyncloader._worker.process_state import (
    init_failure as init_failure,  # the name the engines import
)
from asyncloader._worker.process_state import keep_init_failure, keep_running, keep_sharing


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
    with counter.get_lock():
        worker_id = counter.value
        counter.value += 1
    keep_running(running)
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
    if owner_pid is not None:
        watch_parent(owner_pid)
        # Ctrl-C is the training process's to handle (it stops the workers), as DataLoader's
        # workers leave it: a KeyboardInterrupt here would come back as a batch's error.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_sharing(share_batches)
    seed = base_seed + worker_id
    torch.set_num_threads(1)
    keep_freed_memory()
    seed_all(seed)
    keep_plan(plan)
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
            keep_init_failure(Failure(exc, "".join(traceback.format_exception(exc))))
