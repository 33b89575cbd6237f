"""Shared-memory batch buffers that a worker reuses instead of making a fresh one per batch.

A batch tensor made fresh in shared memory per batch costs, for a 38 MB image batch, the
segment's ``fallocate`` and the page faults of its first write in the worker, and an ``mmap``
and ``munmap`` in the training process. A :class:`BufferPool` in each worker keeps the
segments it lent; the training process (a :class:`Returns`) tells the worker when one is free
again, and the worker writes the next batch into pages it has mapped already. The training
process maps each batch as before and lets go of it once free: a segment it kept mapped
would stay allocated after the worker dropped it. The pool keeps at most ``KEEP_FREE``
free segments, so after a burst of batches in flight (a window the consumer was slow to
drain) it holds about what is in flight again.

The handshake lives in each segment, after the tensor's bytes: two ``int64`` words, written
by one side each, so they never race.

- ``lent`` (the worker's): the generation of the segment's current lending, raised each time
  the worker writes a new batch into it.
- ``freed`` (the training process's): the last generation it received and then saw released:
  no tensor, storage or view of the user's (nor the loader's) holds the segment any more, its
  C++ use count being down to the training process's own reference.

Invariant: the worker writes into a segment only while ``freed == lent``, that is once the
training process has received the last batch written there and nothing of the user's still
holds it. A batch the user keeps is therefore never overwritten, however long it is kept. A
segment that never comes back (the epoch closed while the user held it, the batch failed)
just stays out of use; the pool makes at most ``slots`` segments and then falls back to a
fresh segment per batch, as without it.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncloader._base.compat import empty_shared, new_shared_storage, storage_users
from asyncloader._base.structure import tensors_of
from asyncloader._worker.transport import WithArrays


def _tensors(batch: Any) -> list[torch.Tensor]:
    """The batch's tensors in :func:`~asyncloader._base.structure.tensors_of` order, inside
    the transport's wrapper where it has one."""
    return tensors_of(batch.batch if isinstance(batch, WithArrays) else batch)


#: Bytes kept after a tensor's data for the two handshake words (a cache line).
TRAILER = 64
#: Segments at most in a worker's pool, unless the loader says otherwise.
DEFAULT_SLOTS = 6
#: Free segments a pool keeps besides the one it lends; more are dropped (after a burst of
#: batches in flight), so that it holds about what is in flight, not the most ever was.
KEEP_FREE = 2


def _marks(storage: torch.UntypedStorage, offset: int) -> torch.Tensor:
    """The two handshake words ``[lent, freed]`` of a segment, as an ``int64`` view."""
    return torch.empty(0, dtype=torch.int64).set_(storage, offset // 8, (2,))


_slot_ids = itertools.count()


class _Slot:
    """One segment of the pool: ``capacity`` bytes of data, then the handshake words; ``id``
    names it to the training process for the pool's life."""

    def __init__(self, capacity: int) -> None:
        self.id = next(_slot_ids)
        self.capacity = capacity
        self.storage = new_shared_storage(capacity + TRAILER)
        self.marks = _marks(self.storage, capacity)
        self.marks.zero_()

    @property
    def free(self) -> bool:
        lent, freed = self.marks.tolist()
        return lent == freed

    def lend(self) -> int:
        """Starts a lending; its generation."""
        generation = int(self.marks[0]) + 1
        self.marks[0] = generation
        return generation

    def give_back(self) -> None:
        """Ends the current lending here, for a batch that never left the worker."""
        self.marks[1] = self.marks[0]


@dataclass
class BufferPool:
    """A worker process's segments; see the module docstring.

    Attributes:
        slots: Segments at most.
        token: Names this pool to the training process (pid and a random number).
    """

    slots: int = DEFAULT_SLOTS
    token: tuple[int, int] = field(default_factory=lambda: (os.getpid(), random.getrandbits(62)))
    _all: list[_Slot] = field(default_factory=list)
    _lent: list[tuple[_Slot, int]] = field(default_factory=list)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor in a free segment of exactly its size (the batches of an
        epoch are alike, but for the last), else in a fresh shared segment."""
        nbytes = math.prod(shape) * dtype.itemsize
        capacity = -(-nbytes // TRAILER) * TRAILER
        free = [s for s in self._all if s.capacity == capacity and s.free]
        slot = free[0] if free else None
        for spare in free[1 + KEEP_FREE :]:  # after a burst: let the memory go
            self._all.remove(spare)
        if slot is None and len(self._all) < self.slots and nbytes:
            slot = _Slot(capacity)
            self._all.append(slot)
        if slot is None:
            return empty_shared(shape, dtype)
        self._lent.append((slot, slot.lend()))
        return torch.empty(0, dtype=dtype).set_(slot.storage, 0, shape)

    def settle(self, batch: Any) -> Any:
        """``batch`` (already in shared memory) as it leaves the worker: wrapped in a
        :class:`Pooled` naming the segments it holds, where it holds any. A segment lent since
        the last call that the batch does not hold is given back at once."""
        if not self._lent:
            return batch
        lent, self._lent = self._lent, []
        held = {t.untyped_storage().data_ptr(): k for k, t in enumerate(_tensors(batch))}
        found = []
        for slot, generation in lent:
            k = held.get(slot.storage.data_ptr())
            if k is None:
                slot.give_back()
            else:
                found.append((k, slot.id, generation))
        return Pooled(batch, self.token, found) if found else batch


@dataclass(frozen=True, slots=True)
class Pooled:
    """A batch holding pool segments: ``lent`` is ``(k, slot, generation)`` for each, ``k``
    the position of its tensor in :func:`_tensors` order."""

    batch: Any
    token: tuple[int, int]
    lent: list[tuple[int, int, int]]


_pool: BufferPool | None = None


def set_pool_slots(slots: int) -> None:
    """Gives this worker process a pool of ``slots`` segments (0: none)."""
    global _pool
    _pool = BufferPool(slots) if slots > 0 else None


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised batch tensor in shared memory: from this worker's pool when it has
    one (see :func:`set_pool_slots`), else a fresh segment."""
    if _pool is None:
        return empty_shared(shape, dtype)
    return _pool.empty(shape, dtype)


def settle(batch: Any) -> Any:
    """:meth:`BufferPool.settle` with this worker's pool (``batch`` unchanged without one)."""
    return batch if _pool is None else _pool.settle(batch)


def _holders(marks: torch.Tensor) -> tuple[int | None, int]:
    """Who holds the segment ``marks`` views: the C++ use count of its storage and the Python
    references to the storage object (the user may keep that alone, without a tensor)."""
    storage = marks.untyped_storage()
    return storage_users(storage), sys.getrefcount(storage)


@functools.cache
def _unheld() -> tuple[int | None, int]:
    """:func:`_holders` of a segment held by nothing but its marks view."""
    return _holders(_marks(torch.UntypedStorage(TRAILER), 0))


class _Held:
    """The training process's reference to one segment it received, until it reports it
    free: its marks view (which keeps it mapped until then)."""

    __slots__ = ("freed", "marks", "received")

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.marks = _marks(storage, storage.nbytes() - TRAILER)
        self.received = self.freed = 0

    def data_ptr(self) -> int:
        return self.marks.untyped_storage().data_ptr()

    def release_if_unused(self) -> bool:
        """Tells the worker the segment is free once nothing but this holds it; whether it
        is (or already was)."""
        if self.freed == self.received:
            return True
        unheld = _unheld()
        if unheld[0] is None or _holders(self.marks) != unheld:
            return False
        self.marks[1] = self.freed = self.received
        return True


#: Segments of closed :class:`Returns` that the user still held: swept by every Returns.
_leftover: list[_Held] = []


class Returns:
    """The training process's side: receives :class:`Pooled` batches and tells each worker
    when a segment is free again (at each batch received, and at :meth:`close`).

    Where torch cannot count a storage's users (:func:`storage_users` is ``None``) nothing is
    ever reported free: the workers then fall back to a fresh segment per batch.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[tuple[int, int], int], _Held] = {}

    def received(self, pooled: Pooled) -> Any:
        """The batch inside ``pooled``, its segments recorded."""
        tensors = _tensors(pooled.batch)
        for k, slot, generation in pooled.lent:
            self._record((pooled.token, slot), tensors[k], generation)
        del tensors
        self.sweep()
        return pooled.batch

    def _record(
        self, key: tuple[tuple[int, int], int], tensor: torch.Tensor, generation: int
    ) -> None:
        storage = tensor.untyped_storage()
        held = self._held.get(key)
        if held is None or held.data_ptr() != storage.data_ptr():
            held = self._held[key] = _Held(storage)
        held.received = generation

    def sweep(self) -> None:
        """Reports free every segment the user no longer holds, and lets go of this process's
        mapping of it (the worker may drop it; if it lends it again, it comes back)."""
        released = [key for key, held in self._held.items() if held.release_if_unused()]
        for key in released:
            del self._held[key]
        if _leftover:
            _leftover[:] = [held for held in _leftover if not held.release_if_unused()]

    def close(self) -> None:
        """The epoch is over: drops this process's mappings of the segments. One the user
        still holds is reported free once released, by a later sweep."""
        self.sweep()
        _leftover.extend(self._held.values())
        self._held.clear()
