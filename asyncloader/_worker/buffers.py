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

A segment comes back as soon as the user lets go of its batch, because the training process
checks at each batch it receives and each time the consumer asks for the next one. Nothing
of the loader's may hold a delivered batch in a reference cycle (only the garbage collector
would free it, and the segments would come back in bursts). A segment the user still held
when its epoch closed is checked again every ``IDLE_S`` on the loop that epoch ran on, and
when the next epoch begins. A pool that lends nothing for ``IDLE_S`` (the epoch is over: a
persistent worker waits for the next one) lets all its free segments go, so that their memory
goes back to the machine between epochs.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import random
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from asyncloader._base import empty_shared, holding, new_shared_storage, storage_users, tensors_of
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
#: Seconds without a lending after which a pool lets its free segments go.
IDLE_S = 1.0


def _marks(storage: torch.UntypedStorage, offset: int) -> torch.Tensor:
    """The two handshake words ``[lent, freed]`` of a segment, as an ``int64`` view."""
    return _view(storage, torch.int64, offset // 8, (2,))


def _view(
    storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, shape: tuple[int, ...]
) -> torch.Tensor:
    """A ``dtype`` tensor of ``shape`` on ``storage`` from element ``offset``."""
    # torch's stub of set_ asks for a stride too; without one torch makes it contiguous.
    view: torch.Tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape)  # type: ignore[call-overload]
    return view


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
        return bool(lent == freed)

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
    #: Guards ``_all`` and the lendings against :meth:`trim_if_idle` (another thread).
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _used: float = field(default_factory=time.monotonic)
    _trimming: bool = False

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor in a free segment of exactly its size (the batches of an
        epoch are alike, but for the last), else in a fresh shared segment."""
        nbytes = math.prod(shape) * dtype.itemsize
        capacity = -(-nbytes // TRAILER) * TRAILER
        with self._lock:
            self._used = time.monotonic()
            free = [s for s in self._all if s.capacity == capacity and s.free]
            slot = free[0] if free else None
            for spare in free[1 + KEEP_FREE :]:  # after a burst: let the memory go
                self._all.remove(spare)
            if slot is None and len(self._all) < self.slots and nbytes:
                slot = _Slot(capacity)
                self._all.append(slot)
                self._trim_when_idle()
            if slot is None:
                return empty_shared(shape, dtype)
            self._lent.append((slot, slot.lend()))
        return _view(slot.storage, dtype, 0, shape)

    def _trim_when_idle(self) -> None:
        """Starts, once, a daemon thread that calls :meth:`trim_if_idle` every ``IDLE_S``."""
        if not self._trimming:
            self._trimming = True
            threading.Thread(
                target=_trim_while_alive, args=(self,), name="asyncloader-pool-trim", daemon=True
            ).start()

    def trim_if_idle(self) -> int:
        """Lets every free segment go once nothing was lent for ``IDLE_S``; how many."""
        with self._lock:
            if time.monotonic() - self._used < IDLE_S:
                return 0
            free = [s for s in self._all if s.free]
            self._all = [s for s in self._all if not s.free]
        return len(free)

    def settle(self, batch: Any) -> Any:
        """``batch`` (already in shared memory) as it leaves the worker: wrapped in a
        :class:`Pooled` naming the segments it holds, where it holds any. A segment lent since
        the last call that the batch does not hold is given back at once."""
        with self._lock:
            lent, self._lent = self._lent, []
        if not lent:
            return batch
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


def _trim_while_alive(pool: BufferPool) -> None:
    """Trims ``pool`` every ``IDLE_S`` for as long as it is this process's pool."""
    while _pool is pool:
        time.sleep(IDLE_S)
        pool.trim_if_idle()


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
#: Guards every :class:`Returns` and ``_leftover``: the loader's loop records a batch while the
#: consumer's thread sweeps (:meth:`Returns.sweep` at each ``next()``). Always taken with
#: :func:`~asyncloader._base.threads.holding`: the loop takes it to close an epoch, so a
#: finalizer run under it must not wait for the loop.
_lock = threading.Lock()


class Returns:
    """The training process's side: receives :class:`Pooled` batches and tells each worker
    when a segment is free again: at each batch received, each time the consumer asks for its
    next batch (from its own thread; by then the batch before last is usually let go), and at
    :meth:`close`.

    Where torch cannot count a storage's users (:func:`storage_users` is ``None``) nothing is
    ever reported free: the workers then fall back to a fresh segment per batch.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[tuple[int, int], int], _Held] = {}
        with holding(_lock):  # a new epoch: what the user let go since the last is free for it
            _sweep_leftover()

    def received(self, pooled: Pooled) -> Any:
        """The batch inside ``pooled``, its segments recorded."""
        tensors = _tensors(pooled.batch)
        with holding(_lock):
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
        mapping of it (the worker may drop it; if it lends it again, it comes back). Safe from
        any thread."""
        if not (self._held or _leftover):
            return
        with holding(_lock):
            released = [key for key, held in self._held.items() if held.release_if_unused()]
            for key in released:
                del self._held[key]
            _sweep_leftover()

    def close(self) -> None:
        """The epoch is over: drops this process's mappings of the segments. One the user
        still holds is reported free once released: by a later sweep, or, where this runs on
        an event loop, by that loop every ``IDLE_S`` (so an idle worker can let it go)."""
        self.sweep()
        with holding(_lock):
            _leftover.extend(self._held.values())
            self._held.clear()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if _leftover and loop not in _resweeping:
            _resweeping.add(loop)
            loop.call_later(IDLE_S, _resweep, loop)


#: Loops that sweep ``_leftover`` every ``IDLE_S`` until it is empty.
_resweeping: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _sweep_leftover() -> None:
    """Reports free the segments of closed :class:`Returns` that the user let go since;
    under ``_lock``."""
    if _leftover:
        _leftover[:] = [held for held in _leftover if not held.release_if_unused()]


def _resweep(loop: asyncio.AbstractEventLoop) -> None:
    with holding(_lock):
        _sweep_leftover()
        again = bool(_leftover)
    if again:
        loop.call_later(IDLE_S, _resweep, loop)
    else:
        _resweeping.discard(loop)
