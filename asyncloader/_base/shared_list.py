"""SharedList: records pickled into one byte buffer, so forked workers read them without
copying them.

A list of Python objects is copied page by page into every forked worker that reads it (each
read writes the object's reference count; PyTorch issue 13246). A :class:`SharedList` holds
no Python object per record: one read-only ``uint8`` array of the records pickled end to end,
and ``int64`` arrays of where each starts and ends. Reading record ``i`` unpickles a new
object from its bytes and writes nothing to the buffer's pages, which the workers keep sharing.

Sent to a worker that is started by pickling (spawn, forkserver; ``multiprocessing``'s pickler,
``ForkingPickler``), the buffer is moved into shared memory once (torch's, as a tensor's
storage) and every worker maps it; the training process then reads it there too. Pickled
otherwise (``pickle``, ``copy.deepcopy``) it is sent by value.
"""

from __future__ import annotations

import array
import io
import operator
import pickle
import threading
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, overload

import numpy as np
import torch

from asyncloader._base.compat import empty_shared

#: Records unpickled per step of iteration: bounds read in chunks, not one numpy scalar each.
_CHUNK = 4096


class _Buffer:
    """The bytes every view of one SharedList shares; moved into shared memory at most once
    (every view then reads the moved bytes)."""

    def __init__(self, array: np.ndarray, tensor: torch.Tensor | None = None) -> None:
        array.flags.writeable = False
        self.array = array
        self.view = array.data
        self.tensor = tensor  # the shared-memory tensor the array is a view of, once moved
        self._lock = threading.Lock()

    def shared_tensor(self) -> torch.Tensor:
        """The bytes as a ``uint8`` tensor in shared memory, moved there on the first call."""
        with self._lock:
            if self.tensor is None:
                tensor = empty_shared((len(self.array),), torch.uint8)
                array = tensor.numpy()
                array[:] = self.array
                array.flags.writeable = False
                self.array, self.view, self.tensor = array, array.data, tensor
            return self.tensor


class SharedList(Sequence[Any]):
    """A read-only sequence of picklable records stored as one byte buffer, for datasets that
    would otherwise hold a large list of small Python objects (dicts of annotations, paths).

    Forked workers share its pages with the training process: reading a record copies nothing
    into the worker (a list of dicts is copied into every worker that reads it). Each record is
    pickled once, here; ``shared[i]`` unpickles a new object (so changing it changes nothing
    stored), ``shared[a:b:c]`` is a SharedList over the same buffer.

    Args:
        records: Any iterable of picklable objects (a generator keeps them from all being
            alive at once).

    Raises:
        TypeError: ``records`` is not iterable, or one of its records cannot be pickled
            (named by its position).
    """

    __slots__ = ("__weakref__", "_bounds", "_buffer", "_ends", "_starts")

    def __init__(self, records: Iterable[Any]) -> None:
        try:
            iterator = iter(records)
        except TypeError:
            raise TypeError(
                f"SharedList: records must be an iterable, not {type(records).__name__}"
            ) from None
        # One pickler writing every record to one stream (its memo cleared between records,
        # so each is a whole pickle of its own): no bytes object per record, whose allocations
        # would leave the heap fragmented, and the buffer is the stream's own bytes.
        stream = io.BytesIO()
        pickler = pickle.Pickler(stream, pickle.HIGHEST_PROTOCOL)
        ends = array.array("q")
        for i, record in enumerate(iterator):
            try:
                pickler.dump(record)
            except Exception as exc:
                raise TypeError(
                    f"SharedList: records[{i}] ({type(record).__name__}) cannot be pickled: {exc}"
                ) from exc
            pickler.clear_memo()
            ends.append(stream.tell())
        offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        offsets[1:] = np.frombuffer(ends, dtype=np.int64)
        data = np.frombuffer(stream.getvalue(), dtype=np.uint8)
        del stream, ends
        self._setup(_Buffer(data), offsets[:-1], offsets[1:])

    def _setup(self, buffer: _Buffer, starts: np.ndarray, ends: np.ndarray) -> None:
        starts.flags.writeable = False
        ends.flags.writeable = False
        self._buffer = buffer
        self._starts = starts
        self._ends = ends
        self._bounds: torch.Tensor | None = None  # starts and ends in shared memory, once sent

    @classmethod
    def _of(cls, buffer: _Buffer, starts: np.ndarray, ends: np.ndarray) -> SharedList:
        new = cls.__new__(cls)
        new._setup(buffer, starts, ends)
        return new

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> SharedList: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return SharedList._of(self._buffer, self._starts[index], self._ends[index])
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"SharedList indices must be integers or slices, not {type(index).__name__}"
            ) from None
        n = len(self._starts)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("SharedList index out of range")
        return pickle.loads(self._buffer.view[self._starts.item(i) : self._ends.item(i)])

    def __iter__(self) -> Iterator[Any]:
        for at in range(0, len(self._starts), _CHUNK):
            view = self._buffer.view
            starts = self._starts[at : at + _CHUNK].tolist()
            ends = self._ends[at : at + _CHUNK].tolist()
            for start, end in zip(starts, ends, strict=True):
                yield pickle.loads(view[start:end])

    def __repr__(self) -> str:
        where = ", shared memory" if self.is_shared() else ""
        return f"SharedList({len(self)} records, {self.nbytes} bytes{where})"

    @property
    def nbytes(self) -> int:
        """The bytes of the buffer (shared with this list's slices) and 8 per record."""
        return int(self._buffer.array.nbytes + 8 * (len(self) + 1))

    def is_shared(self) -> bool:
        """Whether the buffer is in shared memory: once sent to a worker started by pickling
        (spawn, forkserver), in the training process and in that worker. Forked workers share
        the training process's memory without it."""
        return self._buffer.tensor is not None

    def __reduce__(self) -> tuple[Any, ...]:
        """By value: the buffer (all of it, for a slice too) and the bounds (``pickle``,
        ``copy``)."""
        array = self._buffer.array if len(self._starts) else np.empty(0, np.uint8)
        return _by_value, (array, self._starts, self._ends)

    def _reduce_for_process(self) -> tuple[Any, ...]:
        """For ``ForkingPickler``: the buffer and the bounds as tensors in shared memory,
        which torch sends as handles; an empty buffer is sent by value."""
        if not (len(self._starts) and len(self._buffer.array)):
            return self.__reduce__()
        tensor = self._buffer.shared_tensor()
        if self._bounds is None:
            bounds = empty_shared((2, len(self._starts)), torch.int64)
            bounds.numpy()[:] = (self._starts, self._ends)
            self._bounds = bounds
        return _from_shared, (tensor, self._bounds)


def _by_value(array: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> SharedList:
    return SharedList._of(_Buffer(array), starts, ends)


def _from_shared(tensor: torch.Tensor, bounds: torch.Tensor) -> SharedList:
    both = bounds.numpy()
    shared = SharedList._of(_Buffer(tensor.numpy(), tensor), both[0], both[1])
    shared._bounds = bounds
    return shared


ForkingPickler.register(SharedList, SharedList._reduce_for_process)
