"""What the transports to fetching workers share (:class:`~asyncloader._engines.channels.Channels`
over pipes and sockets, :class:`~asyncloader._engines.ray.long_poll.LongPoll` over Ray calls):
the choice of a worker for a batch, and one :mod:`~asyncloader._worker.protocol` request per
call of the :class:`~asyncloader._engines.engine.WorkerEngine` interface.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from asyncloader._base import Samples, Seeds
from asyncloader._worker import NextOfStream, OpenStream, Request, RunBatch, StreamOpen


def complete(future: Future[Any], result: Any, error: BaseException | None = None) -> None:
    """Completes a request's ``future`` with ``result`` (or ``error``), unless it is done.

    Its waiter may cancel it from the loop's thread at any moment (the future is never
    marked running), also between a receiver's ``done()`` check and its set: that set would
    raise ``InvalidStateError`` in the receiver, which then left every request after it
    unanswered. Nobody waits for a cancelled request, so it is skipped.
    """
    with contextlib.suppress(InvalidStateError):
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)


class ToWorker(Future[Any]):
    """A request's future that names the worker it went to (``loader.stats`` attributes the
    consumer's wait for the batch to it)."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker


def worker_of(future: Future[Any]) -> int | None:
    """The worker a request went to, or None when the engine does not say."""
    return future.worker if isinstance(future, ToWorker) else None


class Requests:
    """Turns engine calls into requests for :meth:`_request` to send.

    Subclasses set :attr:`num_workers`, :attr:`_lock` and :attr:`_load` (batches each worker
    holds, kept under the lock) and implement :meth:`_request`.
    """

    num_workers: int
    _lock: threading.Lock
    _load: list[int]

    def submit(
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
    ) -> Future[Any]:
        """Runs batch ``seq`` in the worker holding the fewest batches."""
        with self._lock:
            worker = min(range(self.num_workers), key=self._load.__getitem__)
        return self._request(worker, RunBatch(seq, indices, samples, seeds))

    def next_stream(self, worker: int, opening: StreamOpen, number: int) -> Future[Any]:
        """Batch ``number`` of ``worker``'s own iteration of an iterable source for the epoch
        ``opening`` starts (see ``WorkerCore.next_stream``)."""
        return self._request(worker, NextOfStream(opening, number))

    def open_stream(self, worker: int, opening: StreamOpen) -> Future[Any]:
        """Opens ``worker``'s iteration for the epoch ``opening`` starts; resolves to the
        source's own state then (see ``WorkerCore.open_stream``)."""
        return self._request(worker, OpenStream(opening))

    def _request(self, worker: int, request: Request) -> Future[Any]:
        """Sends ``request`` to ``worker``; the future (a :class:`ToWorker`) completes with
        its answer."""
        raise NotImplementedError
