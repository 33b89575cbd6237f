"""The messages between the training process and a fetching worker, whatever carries them
(a local worker's pipe, a Ray actor): what a worker is started with, the requests it answers
(:data:`Request`), how one epoch's iteration of an iterable source is opened in it, and what
it answers at the iteration's end.

Over a pipe or a socket (:func:`asyncloader._worker.loop.serve_on`), the worker first sends
:class:`Ready`; the training process sends :class:`Keyed` requests and finally :data:`STOP`;
the worker answers each request with one message of bytes: the request's key
(:func:`answer_bytes`), then the pickled result. A Ray actor takes ``(number, request)``
pairs in its calls instead.
"""

from __future__ import annotations

import dataclasses
import enum
import io
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar, dataclass_transform

from asyncloader._base import Samples, SourceKind
from asyncloader._worker.plan import BatchPlan

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def _message(cls: type[_T]) -> type[_T]:
    """A frozen, slotted dataclass that pickles as its class and its fields' values: one or
    more go over a pipe with every batch, and a slotted dataclass's own ``__getstate__``
    looks its fields up anew each time."""
    made = dataclasses.dataclass(frozen=True, slots=True)(cls)
    names = tuple(field.name for field in dataclasses.fields(made))  # type: ignore[arg-type]

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return made, tuple(getattr(self, name) for name in names)

    made.__reduce__ = __reduce__  # type: ignore[method-assign]
    return made


@_message
class Ended:
    """What :meth:`WorkerCore.next_stream` answers once the worker's iteration has ended,
    with the source's own state then (``None`` when it keeps none): a dataset that counts
    its epochs, say, goes on from there in the next epoch of a resumed loader."""

    state: Any


#: What it answers for an iteration it never opened: a worker restarted since (a Ray actor
#: with ``max_restarts``) has lost its place in the source.
LOST = "lost"
#: What it answers for an older epoch's iteration once a newer epoch began one (persistent
#: workers iterate one epoch at a time, as DataLoader's do).
SUPERSEDED = "superseded"


@_message
class WorkerConfig:
    """What every worker of a loader needs besides its plan (from the loader's options)."""

    kind: SourceKind
    io_limit: int  # samples this worker fetches at once (at most, with io_budget)
    fetch_threads: int
    batch_size: int | None
    drop_last: bool
    loader_name: str
    io_budget: int | None = None  # io_concurrency="auto": this worker's memory_budget share


@_message
class WorkerSpec:
    """Everything one fetching worker is started with (sent once, at its start)."""

    worker_id: int
    num_workers: int
    base_seed: int
    plan: BatchPlan
    worker_init_fn: Any
    config: WorkerConfig


@dataclasses.dataclass(slots=True)
class StreamOpen:
    """The start of one epoch's iteration in a worker: seed, and where to continue."""

    token: int
    seed: int
    delivered: int  # batches of this worker the consumer already has
    state: Any  # the source's own state after those batches, or None (then replayed)
    epoch: int | None = None  # distributed=True: told to the source's set_epoch first
    #: The epoch is resumed mid-way (a worker that delivered nothing yet may hold a state of
    #: it: one moved from another world size), so ``state`` is loaded after ``set_epoch``.
    resumed: bool = False


@_message
class RunBatch:
    """Make batch ``seq`` of ``indices``: fetch its samples (``samples`` is None) or take
    those fetched already, then transform and collate (``WorkerCore.batch``)."""

    seq: int
    indices: Sequence[Any]
    samples: Samples | None
    seeds: Any  # asyncloader._base.seeding.Seeds, or None


@_message
class OpenStream:
    """Open the worker's own iteration of an iterable source (``WorkerCore.open_stream``)."""

    opening: StreamOpen


@_message
class NextOfStream:
    """Batch ``number`` of the iteration ``opening`` started (``WorkerCore.next_stream``)."""

    opening: StreamOpen
    number: int


#: What a worker is asked to do.
Request = RunBatch | OpenStream | NextOfStream


@_message
class Keyed:
    """A request over a pipe or socket, with the key its answer names."""

    key: int
    request: Request
    trace: bool = False  # the training process is tracing: answer with the events too


class Signal(enum.Enum):
    STOP = "stop"


#: Training process to worker: stop serving (a closed connection means the same).
STOP = Signal.STOP


@_message
class Ready:
    """A worker's first message: its start-up failure (``init_failure()``), or None."""

    init_failure: Any


#: The bytes of an answer's key, ahead of its pickled result.
KEY_BYTES = 8


def answer_bytes(key: int, result: Any) -> memoryview:
    """The answer to the request of ``key``: the key, then ``result`` pickled (by
    ``ForkingPickler``: shared-memory tensors as handles), in one buffer. A result that
    does not pickle raises here, before anything is sent."""
    out = io.BytesIO()
    out.write(key.to_bytes(KEY_BYTES, "little"))
    ForkingPickler(out).dump(result)
    return out.getbuffer()


def read_answer(data: bytes) -> tuple[int, memoryview]:
    """``(key, the pickled result)`` of an answer; unpickling is the receiver's, so that a
    result it cannot rebuild fails its own request only."""
    view = memoryview(data)
    return int.from_bytes(view[:KEY_BYTES], "little"), view[KEY_BYTES:]


def batch_of(request: Request) -> int | None:
    """The batch a request makes: its ``seq``, or its number in the worker's own iteration
    (None for an opening), for crash reports."""
    if isinstance(request, RunBatch):
        return request.seq
    if isinstance(request, NextOfStream):
        return request.number
    return None
