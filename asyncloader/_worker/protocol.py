"""The messages between the training process and a fetching worker, whatever carries them
(a local worker's pipe, a Ray actor): what a worker is started with, the requests it answers
(:data:`Request`), how one epoch's iteration of an iterable source is opened in it, and what
it answers at the iteration's end.

Over a pipe or a socket (:func:`asyncloader._worker.loop.serve_on`), the worker first sends
:class:`Ready`; the training process sends :class:`Keyed` requests and finally :data:`STOP`;
the worker answers each request with :class:`Done`, then the pickled result as bytes. A Ray
actor takes ``(number, request)`` pairs in its calls instead.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from asyncloader._base.kinds import SourceKind
from asyncloader._worker.plan import BatchPlan


@dataclasses.dataclass(frozen=True, slots=True)
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


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What every worker of a loader needs besides its plan (from the loader's options)."""

    kind: SourceKind
    io_limit: int  # samples this worker fetches at once (at most, with io_budget)
    fetch_threads: int
    batch_size: int | None
    drop_last: bool
    loader_name: str
    io_budget: int | None = None  # io_concurrency="auto": this worker's memory_budget share


@dataclasses.dataclass(frozen=True, slots=True)
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


@dataclasses.dataclass(frozen=True, slots=True)
class RunBatch:
    """Make batch ``seq`` of ``indices``: fetch its samples (``samples`` is None) or take
    those fetched already, then transform and collate (``WorkerCore.batch``)."""

    seq: int
    indices: Sequence[Any]
    samples: list[Any] | None
    seeds: Any  # asyncloader._base.seeding.Seeds, or None


@dataclasses.dataclass(frozen=True, slots=True)
class OpenStream:
    """Open the worker's own iteration of an iterable source (``WorkerCore.open_stream``)."""

    opening: StreamOpen


@dataclasses.dataclass(frozen=True, slots=True)
class NextOfStream:
    """Batch ``number`` of the iteration ``opening`` started (``WorkerCore.next_stream``)."""

    opening: StreamOpen
    number: int


#: What a worker is asked to do.
Request = RunBatch | OpenStream | NextOfStream


@dataclasses.dataclass(frozen=True, slots=True)
class Keyed:
    """A request over a pipe or socket, with the key its :class:`Done` answer names."""

    key: int
    request: Request


class Signal(enum.Enum):
    STOP = "stop"


#: Training process to worker: stop serving (a closed connection means the same).
STOP = Signal.STOP


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """A worker's first message: its start-up failure (``init_failure()``), or None."""

    init_failure: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """The answer to the request of ``key`` follows, as pickled bytes."""

    key: int


def batch_of(request: Request) -> int | None:
    """The batch a request makes: its ``seq``, or its number in the worker's own iteration
    (None for an opening), for crash reports."""
    if isinstance(request, RunBatch):
        return request.seq
    if isinstance(request, NextOfStream):
        return request.number
    return None
