"""What runs in the executor: one batch's fetch, transform and collate, and worker set-up.

The work unit is a batch, so per-task overhead (IPC, pickling) is paid once per batch. In
asyncloader's own process pool the :class:`BatchPlan` (dataset, transform, collate) reaches
each worker once, through the pool's initializer; tasks then carry only ``(seq, indices)`` or
the raw samples fetched on the event loop. With a user executor or without workers the plan
travels with each task instead (by reference in threads, pickled for a foreign process pool).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing
from torch.utils.data._utils import worker as _torch_worker

from asyncloader._failure import Failure


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Describes the worker process the calling code runs in.

    Attributes:
        id: The worker's id, ``0 <= id < num_workers``.
        num_workers: How many worker processes the loader started.
        seed: The seed this worker's ``torch``, ``random`` and ``numpy`` RNGs were given.
        dataset: This worker's copy of the dataset (``None`` when samples are fetched on the
            event loop and the worker only transforms and collates them).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What the executor does to one batch.

    Attributes:
        dataset: Set when the executor fetches samples itself (sync map-style source).
        transform: Applied to every sample, or ``None``.
        collate: Turns the list of samples into the batch (or converts one sample when not
            batching).
        batched: ``False`` for ``batch_size=None``: each batch is a single sample.
    """

    dataset: Any
    transform: Callable[[Any], Any] | None
    collate: Callable[[Any], Any]
    batched: bool


_info: WorkerInfo | None = None
_plan: BatchPlan | None = None


def get_worker_info() -> WorkerInfo | None:
    """Returns the :class:`WorkerInfo` inside an asyncloader worker process, ``None`` elsewhere."""
    return _info


def seed_all(seed: int) -> None:
    """Seeds the global ``torch``, ``random`` and ``numpy`` generators."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def init_worker(
    counter: Any,
    num_workers: int,
    base_seed: int,
    plan: BatchPlan,
    worker_init_fn: Callable[[int], None] | None,
) -> None:
    """Initializer of each pool process: takes an id, seeds, keeps the plan, calls the hook."""
    global _info, _plan
    with counter.get_lock():
        worker_id = counter.value
        counter.value += 1
    seed = base_seed + worker_id
    torch.set_num_threads(1)
    seed_all(seed)
    _plan = plan
    _info = WorkerInfo(worker_id, num_workers, seed, plan.dataset)
    # Also answer torch.utils.data.get_worker_info(): datasets written for DataLoader rely on
    # it, and default_collate then stacks straight into shared memory (one copy less).
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=plan.dataset
    )
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def run_batch(
    plan: BatchPlan | None, seq: int, indices: Sequence[Any], samples: list[Any] | None
) -> Any:
    """Fetches (when ``samples`` is None), transforms and collates one batch.

    Returns:
        The batch, or a :class:`Failure` naming the stage and sample that raised.
    """
    plan = plan if plan is not None else _plan
    assert plan is not None, "run_batch without a plan outside an initialised worker"
    stage, index = "fetch", None
    try:
        if samples is None:
            dataset = plan.dataset
            samples = []
            for index in indices:
                samples.append(dataset[index])
        if plan.transform is not None:
            stage = "transform"
            transform = plan.transform
            for pos in range(len(samples)):
                index = indices[pos]
                samples[pos] = transform(samples[pos])
        stage, index = "collate", None
        return plan.collate(samples if plan.batched else samples[0])
    except Exception as exc:
        return Failure.capture(exc, stage, seq, indices, index)
