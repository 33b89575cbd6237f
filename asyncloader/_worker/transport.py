"""How a finished batch leaves a worker process and is unpacked in the consumer's process.

A batch of :data:`BY_VALUE_BYTES` or more is moved into shared memory before it is returned:
tensors with torch's sharing, numpy arrays as tensors viewing shared memory (turned back into
arrays by :func:`from_shared`), so only handles cross the pipe. A smaller batch is pickled by
value: receiving a shared-memory handle (a socket connection per storage for its fd, then an
mmap) costs more than copying it. A batch without arrays (rows as Python objects) is pickled
once, right away (:func:`pickled_without_arrays`): looking for arrays in it first would cost
as much again as pickling it.
"""

from __future__ import annotations

import errno
import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

import asyncloader._base  # noqa: F401  its compat: torch's shared-memory pickling
from asyncloader._base import DESCEND, array_bytes, arrays_of, map_structure


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


def _plain(x: torch.Tensor) -> bool:
    """A dense CPU tensor of a numpy dtype's kind, without autograd: asyncloader's fast paths
    take it. Any other tensor (nested, sparse, quantized, a subclass, on a device, needing
    grad) travels as torch's own multiprocessing pickling sends it, as under DataLoader."""
    return (
        type(x) is torch.Tensor
        and x.layout is torch.strided
        and not x.is_nested
        and not x.is_quantized
        and not x.requires_grad
        and x.device.type == "cpu"
    )


def _share(x: Any, found: list[bool]) -> Any:
    if isinstance(x, torch.Tensor):
        dense = x.layout is torch.strided and not x.is_nested
        return x.share_memory_() if dense and x.device.type == "cpu" else x
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


def _by_value(x: Any, found: list[bool]) -> Any:
    if isinstance(x, torch.Tensor):
        if not _plain(x):
            return x
        try:
            array = x.numpy()
        except TypeError:  # no numpy dtype (bfloat16...): shared memory it is
            return x.share_memory_()
        found.append(True)
        return TensorValue(array)
    return DESCEND


def by_value(batch: Any) -> Any:
    """Readies a batch to leave a worker by value: its plain tensors as numpy arrays, which
    pickle protocol 5 (and Ray's object store) can carry out of band; see :func:`from_shared`."""
    found: list[bool] = []
    packed = map_structure(batch, lambda x: _by_value(x, found))
    return WithArrays(packed) if found else packed


class Pickled:
    """A batch pickled already, in the answer that carries it: unpickled with that answer."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return pickle.loads, (self.data,)


class _HasArrays(Exception):
    pass


class _StopAtArrays(ForkingPickler):
    """Pickles as the answer's pickler does, and stops at the first tensor or array (only
    objects of other than the builtin types reach ``reducer_override``: rows of ints,
    strings, lists and dicts are pickled at C speed)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            raise _HasArrays
        return NotImplemented


def pickled_without_arrays(batch: Any) -> Pickled | None:
    """``batch`` pickled, when it holds no tensor or array; else None (also when it does not
    pickle: sending it then says why, as it would have)."""
    out = io.BytesIO()
    try:
        _StopAtArrays(out).dump(batch)
    except Exception:  # _HasArrays, or what the answer's own pickling will report
        return None
    return Pickled(out.getvalue())


def to_shared(batch: Any) -> Any:
    """Readies a batch to leave a worker: pickled already when it holds no arrays, by value
    when small, else in shared memory.

    Raises:
        OSError: Shared memory is full (ENOSPC), with how to make room.
    """
    pickled = pickled_without_arrays(batch)
    if pickled is not None:  # rows as Python objects: nothing to hand over but the pickle
        return pickled
    arrays = arrays_of(batch)
    if not arrays:  # arrays only where arrays_of does not look (torch pickles them)
        return batch
    if sum(map(array_bytes, arrays)) < BY_VALUE_BYTES:
        return by_value(batch)
    found: list[bool] = []
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
