"""Requests to the Ray actors and their answers through Ray's calls and object store:
:class:`LongPoll`, several requests to a call and each answer as soon as it is ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from ray.exceptions import RayActorError

from asyncloader._base import DESCEND, Trimmed, map_structure
from asyncloader._engines import Requests, ToWorker, complete
from asyncloader._worker import Request, RunBatch, TensorValue, WithArrays

_tokens = itertools.count()
_NO_LOOP = object()  # a flush is scheduled off any loop


@dataclasses.dataclass(slots=True)
class _Request:
    """A request for an actor: its number (unique, the actor's key for it), what it asks,
    and the future its answer completes."""

    number: int
    request: Request
    out: Future[Any]

    def wire(self) -> tuple[int, Request]:
        return self.number, self.request


def _writable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x if x.flags.writeable else x.copy()
    if isinstance(x, TensorValue):  # a tensor sent as an array (by_value): its own copy too
        return x if x.array.flags.writeable else TensorValue(x.array.copy())
    if isinstance(x, WithArrays):
        return WithArrays(map_structure(x.batch, _writable))
    if isinstance(x, Trimmed):  # a batch some samples were skipped from: its batch too
        x.batch = map_structure(x.batch, _writable)
        return x
    return DESCEND


def received(result: Any) -> Any:
    """A result as it comes out of Ray's object store, made safe to hand to the user."""
    return map_structure(result, _writable)


class LongPoll(Requests):
    """Requests to a :class:`RayEngine`'s actors and their answers, through Ray's calls and
    object store: what actors on other nodes use.

    Requests and answers travel in two kinds of call to each actor (:meth:`RayWorker.exchange`),
    so that an answer leaves as soon as it is ready and a call carries whatever is:

    - a *poll*, one outstanding per actor while the actor holds requests: it returns once
      some are answered, with every answer ready then, and is sent again at once, carrying
      the requests queued meanwhile;
    - a *push* of the queue (the requests of one turn of the epoch's event loop leave
      together) when the actor runs short of work, one in flight per actor; it returns at
      once, with the answers ready then (see :meth:`_due`).

    An answer names the actor's incarnation: one never seen before means Ray restarted the
    actor, which lost what it held, and every request it held not answered yet is sent again.

    Thread-safe: requests come from the epoch's loop, answers complete on Ray's threads; calls
    leave from the loop of the newest request (or a thread of their own, off any loop).

    Liveness: while an actor holds a request (``_load > 0``), a poll to it is outstanding or
    a flush is scheduled that sends one: :meth:`_flush` clears ``_flush_on`` and reads
    :meth:`_due` under one lock hold, so an answer after that schedules its own flush
    (:meth:`_flush_later`), and a flush lost with a closed loop is redone by the next
    request's. Each request completes once: by its answer, by :meth:`_lose` (the call
    failed, the actor died), or cancelled by :meth:`stop`.
    """

    def __init__(self, actors: list[Any], incarnations: list[set[str]]) -> None:
        """``actors``' handles, and per actor the incarnations seen (at start)."""
        self.num_workers = n = len(actors)
        self._actors = actors
        self._lock = threading.Lock()
        self._load = [0] * n  # requests held per actor, queued ones included
        self._held: dict[int, tuple[int, _Request]] = {}  # number -> (actor, request)
        self._outbox: list[list[_Request]] = [[] for _ in range(n)]  # requests not yet sent
        self._polling = [False] * n  # a poll is outstanding
        self._pushing = [False] * n  # a push is in flight
        self._incarnations = incarnations  # per actor, those seen answer
        self._dead: dict[int, tuple[str, list[Request]]] = {}  # actor -> (why, what it held)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the newest request
        # the loop a flush is scheduled on (or _NO_LOOP): a request from another (a new
        # epoch's, after the old loop closed with the flush unrun) schedules its own
        self._flush_on: object = None
        self._closed = False

    @property
    def broken(self) -> bool:
        return bool(self._dead)

    def _request(self, worker: int, request: Request) -> Future[Any]:
        """Queues a request for ``worker``; :meth:`_flush` sends the queue after the caller's
        event loop ends its turn (at once when called off a loop)."""
        pending = _Request(next(_tokens), request, ToWorker(worker))
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if self._dead or self._closed:
                raise BrokenProcessPool("a Ray actor died; the workers take no more work")
            self._load[worker] += 1
            self._held[pending.number] = (worker, pending)
            self._outbox[worker].append(pending)
            self._loop = loop
            if loop is not None and self._flush_on is loop:
                return pending.out
            self._flush_on = loop
        if loop is None:
            self._flush()
        else:
            loop.call_soon(self._flush)
        return pending.out

    def _flush(self) -> None:
        """Sends each actor the call due to it (:meth:`_due`), carrying the actor's queue."""
        calls = []
        with self._lock:
            self._flush_on = None
            if self._closed:
                return
            for worker in range(self.num_workers):
                poll = self._due(worker)
                if poll is not None:
                    (self._polling if poll else self._pushing)[worker] = True
                    calls.append((worker, poll, self._outbox[worker]))
                    self._outbox[worker] = []
        for worker, poll, requests in calls:
            self._call(worker, poll, requests)

    def _due(self, worker: int) -> bool | None:
        """The call due to ``worker`` now (under the lock): a poll (``True``) when it holds
        requests and none is outstanding; else a push (``False``) of its queue when no push is
        in flight and it runs short of work (fewer than half the requests it holds are sent:
        otherwise they wait to leave with the next poll); else none."""
        load, queued = self._load[worker], len(self._outbox[worker])
        if load and not self._polling[worker]:
            return True
        if queued and not self._pushing[worker] and (load - queued) * 2 < load:
            return False
        return None

    def _flush_later(self) -> None:
        """After an answer: sends the calls it made due, from the newest request's loop."""
        with self._lock:
            loop = self._loop
            on = _NO_LOOP if loop is None else loop
            due = any(self._due(w) is not None for w in range(self.num_workers))
            if self._flush_on is on or not due or self._closed:
                return
            self._flush_on = on
        if loop is None:  # requests come from no loop: send from a thread, not Ray's own
            threading.Thread(target=self._flush, name="asyncloader-ray-flush").start()
            return
        try:
            loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is gone: the next request's flush sends them
            with self._lock:
                self._flush_on = None

    def _call(self, worker: int, poll: bool, requests: list[_Request]) -> None:
        try:
            ref = self._actors[worker].exchange.remote([r.wire() for r in requests], poll)
        except BaseException as exc:  # the actor handle is gone (shut down meanwhile)
            self._lose(worker, exc)
            return
        ref.future().add_done_callback(lambda answer: self._answered(worker, poll, answer))

    def _answered(self, worker: int, poll: bool, answer: Future[Any]) -> None:
        try:
            incarnation, answers = answer.result()
        except RayActorError as exc:
            self._lose(worker, BrokenProcessPool(f"Ray actor {worker} died"), exc)
            return
        except BaseException as exc:  # Ray's own failure (the object lost...): so are the
            self._lose(worker, exc)  # answers it carried, unknown which
            return
        settled = []
        with self._lock:
            if poll:
                self._polling[worker] = False
            else:
                self._pushing[worker] = False
            for number, ok, value in answers:
                entry = self._held.pop(number, None)
                if entry is not None:  # else answered already (sent twice, after a restart)
                    self._load[worker] -= 1
                    settled.append((entry[1].out, ok, value))
            seen = self._incarnations[worker]
            if incarnation not in seen:  # Ray restarted the actor: what it held is lost
                seen.add(incarnation)
                queued = {r.number for r in self._outbox[worker]}
                self._outbox[worker][:0] = [
                    r for w, r in self._held.values() if w == worker and r.number not in queued
                ]
        self._flush_later()
        for out, ok, value in settled:
            if out.done():
                continue
            if ok:
                complete(out, received(value))
            else:
                complete(out, None, value)

    def _lose(self, worker: int, error: BaseException, died: RayActorError | None = None) -> None:
        """Fails every request ``worker`` holds with ``error`` (its answers are lost); the
        actor is dead when ``died`` says why."""
        with self._lock:
            lost = [r for w, r in self._held.values() if w == worker]
            for r in lost:
                del self._held[r.number]
            self._load[worker] = 0
            self._outbox[worker] = []
            self._polling[worker] = self._pushing[worker] = False
            if died is not None:
                why = str(died).splitlines()[0]
                self._dead.setdefault(worker, (why, [r.request for r in lost]))
        for r in lost:
            complete(r.out, None, error)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        notes = []
        for worker, (why, held) in sorted(self._dead.items()):
            seqs = [r.seq for r in held if isinstance(r, RunBatch)]
            what = (
                ", ".join(f"batch {s} (indices {list(inflight.get(s, ()))[:16]})" for s in seqs)
                or "its own iteration of the source"
            )
            notes.append(f"Ray actor {worker} died while running {what}: {why}")
        return "; ".join(notes)

    def stop(self) -> None:
        """Takes no more requests; what the actors hold is cancelled (nobody waits for it now:
        the epoch ended, or the loader closed). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held = [r for _, r in self._held.values()]
            self._held.clear()
            self._outbox = [[] for _ in range(self.num_workers)]
        for r in held:
            r.out.cancel()

    def close(self) -> None:
        """Nothing more to release: the actors' answers stop with the actors."""
