"""What runs in the executor: one batch's fetch, transform and collate, and worker set-up.

The work unit is a batch, so per-task overhead (IPC, pickling) is paid once per batch. In
asyncloader's own process pool the :class:`BatchPlan` (dataset, transform, collate) reaches
each worker once, through the pool's initializer; tasks then carry only ``(seq, indices)`` or
the raw samples fetched on the event loop. With a user executor or without workers the plan
travels with each task instead (by reference in threads, pickled for a foreign process pool).

In a worker process a finished batch of 1 MiB or more is moved into shared memory before it is
returned: tensors with torch's sharing, numpy arrays as tensors viewing shared memory (turned
back into arrays by :func:`from_shared` in the consumer's process), so only handles cross the
pipe. A smaller batch is pickled by value: receiving a shared-memory handle (a socket
connection per storage for its fd, then an mmap) costs more than copying it.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # registers torch's shared-memory tensor pickling
from torch.utils.data._utils import worker as _torch_worker

from asyncloader._failure import Failure
from asyncloader._malloc import keep_freed_memory
from asyncloader._structure import DESCEND, map_structure


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
_slots: Any = None  # shared [pid, seq] per worker id: which batch each worker is running


def get_worker_info() -> WorkerInfo | None:
    """Returns the :class:`WorkerInfo` inside an asyncloader worker process, ``None`` elsewhere."""
    return _info


def seed_all(seed: int) -> None:
    """Seeds the global ``torch`` (CPU), ``random`` and ``numpy`` generators.

    ``torch.default_generator`` rather than ``torch.manual_seed``: the latter also visits every
    accelerator backend and costs ~170 us, too much to pay per sample.
    """
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(epoch_seed: int, key: Any) -> int:
    """The seed of one sample (``key`` = its index) or batch, the same in every process.

    Non-integer indices hash through ``crc32(repr)``: ``hash()`` of a str differs per process.
    """
    if not isinstance(key, int):
        key = zlib.crc32(repr(key).encode())
    return _mix(epoch_seed ^ _mix(key & _MASK64)) >> 1


#: Seeding the global RNGs and drawing from them must not interleave across threads of one
#: process (with num_workers=0 the fetch threads and the transform thread share them).
RNG_LOCK = threading.Lock()


def call_seeded(epoch_seed: int | None, key: Any, fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, with the global RNGs seeded from ``(epoch_seed, key)`` first when set."""
    if epoch_seed is None:
        return fn(arg)
    with RNG_LOCK:
        seed_all(sample_seed(epoch_seed, key))
        return fn(arg)


def init_worker(
    counter: Any,
    slots: Any,
    num_workers: int,
    base_seed: int,
    plan: BatchPlan,
    worker_init_fn: Callable[[int], None] | None,
) -> None:
    """Initializer of each pool process: takes an id, seeds, keeps the plan, calls the hook.

    It also makes malloc keep a batch's freed samples for the next batch
    (:func:`asyncloader._malloc.keep_freed_memory`).
    """
    global _info, _plan, _slots
    with counter.get_lock():
        worker_id = counter.value
        counter.value += 1
    _slots = (slots, worker_id)
    slots[2 * worker_id], slots[2 * worker_id + 1] = os.getpid(), -1
    seed = base_seed + worker_id
    torch.set_num_threads(1)
    keep_freed_memory()
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


class SharedArray:
    """A numpy array travelling as a tensor over shared memory; see :func:`from_shared`."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class WithArrays:
    """Marks a batch holding SharedArrays or TensorValues, so the consumer side walks only
    those batches."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


def _share(x: Any, found: list[bool]) -> Any:
    if isinstance(x, torch.Tensor):
        return x.share_memory_() if x.device.type == "cpu" else x
    if isinstance(x, np.ndarray) and x.dtype != object:
        found.append(True)
        return SharedArray(torch.from_numpy(np.ascontiguousarray(x)).share_memory_())
    return DESCEND


#: Batches smaller than this travel by value: handing over a shared-memory segment (a socket
#: connection per storage to receive its fd, then an mmap) costs more than copying them.
BY_VALUE_BYTES = 1 << 20


class TensorValue:
    """A small tensor travelling by value, as a numpy array; see :func:`from_shared`."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def nbytes(batch: Any) -> int:
    """Bytes held by the tensors and numpy arrays in ``batch`` (any nesting)."""
    total = 0

    def count(x: Any) -> Any:
        nonlocal total
        if isinstance(x, torch.Tensor):
            total += x.nbytes
            return x
        if isinstance(x, np.ndarray):
            total += x.nbytes
            return x
        return DESCEND

    map_structure(batch, count)
    return total


def _by_value(x: Any, found: list[bool]) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.requires_grad or x.is_sparse:
            return x.share_memory_() if x.device.type == "cpu" else x
        try:
            array = x.numpy()
        except TypeError:  # no numpy dtype (bfloat16...): shared memory it is
            return x.share_memory_()
        found.append(True)
        return TensorValue(array)
    return DESCEND


def to_shared(batch: Any) -> Any:
    """Readies a batch to leave a worker: by value when small, else in shared memory.

    Raises:
        OSError: Shared memory is full (ENOSPC), with how to make room.
    """
    found: list[bool] = []
    if nbytes(batch) < BY_VALUE_BYTES:
        packed = map_structure(batch, lambda x: _by_value(x, found))
        return WithArrays(packed) if found else packed
    try:
        shared = map_structure(batch, lambda x: _share(x, found))
    except RuntimeError as exc:
        if "No space left on device" not in str(exc) and "errno 28" not in str(exc).lower():
            raise
        raise OSError(
            errno.ENOSPC,
            "asyncloader: shared memory (/dev/shm) is too small for this batch. Make it larger "
            "(docker run --shm-size=8g; Kubernetes: an emptyDir with medium: Memory mounted at "
            "/dev/shm), or lower batch_size, prefetch or num_workers.",
        ) from exc
    return WithArrays(shared) if found else shared


def _unshare(x: Any) -> Any:
    if isinstance(x, SharedArray):
        return x.tensor.numpy()
    if isinstance(x, TensorValue):
        return torch.from_numpy(x.array)
    return DESCEND


def from_shared(result: Any) -> Any:
    """Undoes :func:`to_shared` in the consumer's process: arrays come back as numpy arrays."""
    if isinstance(result, WithArrays):
        return map_structure(result.batch, _unshare)
    return result


def run_batch(
    plan: BatchPlan | None,
    seq: int,
    indices: Sequence[Any],
    samples: list[Any] | None,
    epoch_seed: int | None = None,
) -> Any:
    """Fetches (when ``samples`` is None), transforms and collates one batch.

    Args:
        epoch_seed: When set, the global RNGs are seeded from ``(epoch_seed, index)`` before
            each sample's ``__getitem__`` and ``transform``, and from ``(epoch_seed, seq)``
            before collate: the batch is then the same whichever worker makes it.

    Returns:
        The batch (in shared memory, in a worker process), or a :class:`Failure` naming the
        stage and sample that raised.
    """
    plan = plan if plan is not None else _plan
    assert plan is not None, "run_batch without a plan outside an initialised worker"
    if _slots is not None:
        _slots[0][2 * _slots[1] + 1] = seq
    stage, index = "fetch", None
    try:
        if samples is None:
            dataset = plan.dataset
            samples = []
            getitem = dataset.__getitem__
            for index in indices:
                samples.append(call_seeded(epoch_seed, index, getitem, index))
        if plan.transform is not None:
            stage = "transform"
            transform = plan.transform
            for pos in range(len(samples)):
                index = indices[pos]
                samples[pos] = call_seeded(epoch_seed, index, transform, samples[pos])
        stage, index = "collate", None
        batch = call_seeded(
            epoch_seed, -1 - seq, plan.collate, samples if plan.batched else samples[0]
        )
        if _info is not None:
            stage = "share"
            batch = to_shared(batch)
        return batch
    except Exception as exc:
        return Failure.capture(exc, stage, seq, indices, index)
    finally:
        if _slots is not None:
            _slots[0][2 * _slots[1] + 1] = -1
