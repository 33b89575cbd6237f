"""Workers on a Ray cluster: ``AsyncLoader(dataset, ..., engine=RayEngine(num_workers=N))``.

Each worker is a Ray actor running the same pipeline as a local ``fetch_in_workers=True``
worker (:class:`asyncloader._worker.loop.WorkerCore` on the actor's event loop): it fetches,
transforms and collates the batches it is given, or iterates its own copy of an iterable
source. The dataset, ``transform`` and ``collate_fn`` reach each actor once, when it starts;
a request carries only indices.

How requests and answers travel depends on where the actors run. When every actor is on the
training process's node (and ``local_sockets``, the default), each connects to a Unix socket
of the training process and serves it as a local worker serves its pipe
(:mod:`asyncloader._actor_sockets`): no Ray call and no object store per batch. Otherwise
requests and answers travel several to a Ray call, a batch's answer as soon as it is ready
(see :class:`LongPoll`), and batches come back through Ray's object store; numpy arrays
there are read-only views of the store, so they are copied once on arrival (the batch you get
is writable and never aliases the store; tensors arrive as copies already). Either way the
batch you get is writable and your own.

The actors run on whatever nodes the connected cluster has: ``ray.init(address=...)`` first,
or a local cluster is started on first use. Ray is an optional extra (``pip install
asyncloader[ray]``), imported only by this module.

An actor that dies mid-epoch raises :class:`~asyncloader.errors.WorkerCrashedError`, as a
local worker does. With Ray's own ``max_restarts`` and ``max_task_retries`` actor options
(then requests always travel through Ray, wherever the actors run),
Ray restarts it and retries its outstanding calls instead, and the restarted actor is sent
every request the lost one held: each batch is still delivered once (an actor runs a request
once by its number, the training process takes one answer per request, and a retry makes the
same batch). A worker iterating its own copy of an iterable source cannot be restarted in
place (its position is gone): the epoch then raises ``WorkerCrashedError``, and resuming from
``state_dict()`` continues it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import os
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from asyncloader._actor_sockets import (
    ACCEPT_TIMEOUT_S,
    ActorSockets,
    accept,
    connect_actor,
    listening,
)
from asyncloader._base.seeding import Seeds
from asyncloader._base.skipping import Trimmed
from asyncloader._base.structure import DESCEND, map_structure
from asyncloader._config.options import Options
from asyncloader._procs import worker_specs
from asyncloader._worker.loop import WorkerCore
from asyncloader._worker.plan import BatchPlan
from asyncloader._worker.protocol import StreamOpen, WorkerSpec
from asyncloader._worker.startup import init_failure, setup_worker
from asyncloader._worker.transport import TensorValue, WithArrays
from asyncloader.errors import WorkerCrashedError

__all__ = ["RayEngine"]

_tokens = itertools.count()
_NO_LOOP = object()  # a flush is scheduled off any loop


class RayEngine:
    """Runs a loader's workers as Ray actors (see the module docstring).

    Args:
        num_workers: Actors to start (each ``num_cpus=1`` unless ``actor_options`` say
            otherwise). The loader's ``num_workers`` is this; ``io_concurrency`` is the total
            in flight across them.
        actor_options: Passed to ``ActorClass.options()``: ``num_cpus``, ``resources``,
            ``scheduling_strategy``, ``runtime_env``, ``max_restarts`` and
            ``max_task_retries``... Without a ``runtime_env`` the actors get this process's
            ``sys.path`` as ``PYTHONPATH``, so a dataset class defined beside your script
            unpickles on a local cluster; on a remote one, install your code on the nodes or
            ship it with ``runtime_env``.
        local_sockets: When every actor runs on this process's node, they answer over Unix
            sockets rather than through Ray's calls and object store (``False``: always
            through Ray). Ignored with ``max_restarts``, which needs Ray's path.

    Use ``persistent_workers=True`` with it: actors take seconds to start, and otherwise each
    epoch starts its own.
    """

    def __init__(
        self, num_workers: int = 2, *, local_sockets: bool = True, **actor_options: Any
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if not isinstance(local_sockets, bool):
            raise TypeError(f"local_sockets must be a bool, got {local_sockets!r}")
        self.num_workers = num_workers
        self.local_sockets = local_sockets
        self.actor_options = actor_options

    def bind(self, options: Options, plan: BatchPlan, base_seed: int) -> RayWorkers:
        """The actors of one loader's epoch (or of all its epochs, with persistent workers)."""
        return RayWorkers(self, options, plan, base_seed)

    def __repr__(self) -> str:
        return (
            f"RayEngine(num_workers={self.num_workers}, local_sockets={self.local_sockets}, "
            f"**{self.actor_options!r})"
        )


class Inbox:
    """An actor's requests: each runs once on ``core`` (keyed by its number: a number sent
    again, by a retried call or after a restart, joins the one running or answered), and its
    answer waits until :meth:`collect` takes it. On the actor's event loop.

    Args:
        core: Has the methods requests name, and ``spawn(coroutine, name)`` (a task that
            ``core``'s own close cancels).
    """

    def __init__(self, core: Any) -> None:
        self._core = core
        self._running: set[int] = set()
        self._answers: dict[int, tuple[bool, Any]] = {}  # request number -> answer
        self._news = asyncio.Event()
        self._closing = False

    def start(self, requests: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        """Starts ``requests``: a number, a method's name and its arguments, each."""
        for number, method, args in requests:
            if number not in self._running and number not in self._answers:
                self._running.add(number)
                task = self._core.spawn(getattr(self._core, method)(*args), f"{method}:{number}")
                task.add_done_callback(functools.partial(self._finished, number))

    def _finished(self, number: int, task: asyncio.Task[Any]) -> None:
        self._running.discard(number)
        if task.cancelled():
            return  # closing: nobody waits for it
        error = task.exception()
        self._answers[number] = (True, task.result()) if error is None else (False, error)
        self._news.set()

    async def collect(self, wait: bool) -> list[tuple[int, bool, Any]]:
        """The answers not collected yet: ``(number, True, result)``, or ``(number, False,
        exception)`` for a request that raised. With ``wait``, once there is one at least, or
        at once when none is running (the caller's may be lost: Ray restarted the actor) or
        the inbox closes."""
        while wait and not self._answers and self._running and not self._closing:
            self._news.clear()
            await self._news.wait()
        answers, self._answers = self._answers, {}
        return [(number, ok, value) for number, (ok, value) in answers.items()]

    def close(self) -> None:
        """Wakes the waiting :meth:`collect`: it returns what it has."""
        self._closing = True
        self._news.set()


class RayWorker:
    """The actor: one worker's :class:`WorkerCore` on the actor's event loop, behind an
    :class:`Inbox`."""

    def __init__(self, spec: WorkerSpec) -> None:
        setup_worker(
            None, spec.worker_id, spec.num_workers, spec.base_seed, spec.plan,
            spec.worker_init_fn, False,
        )  # fmt: skip
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._spec = spec
        self._core: WorkerCore | None = None
        self._inbox: Inbox | None = None
        #: Tells this incarnation of the actor from the one Ray restarted it as.
        self._incarnation = uuid.uuid4().hex

    async def ready(self) -> tuple[Any, str]:
        return init_failure(), self._incarnation

    async def connect(self, path: str, node: str) -> bool:
        """Serves the training process over its Unix socket at ``path`` from now on, when on
        its ``node`` and able to reach the socket (see :mod:`asyncloader._actor_sockets`)."""
        if ray.get_runtime_context().get_node_id() != node:
            return False
        spec = self._spec
        return connect_actor(path, spec.plan, spec.config, spec.worker_id)

    async def exchange(
        self, requests: list[tuple[int, str, tuple[Any, ...]]], wait: bool
    ) -> tuple[str, list[tuple[int, bool, Any]]]:
        """Starts ``requests`` and answers those finished since the last call (see
        :meth:`Inbox.collect`), with the actor's incarnation."""
        if self._inbox is None:  # on the actor's loop, which __init__ does not run on
            spec = self._spec
            self._core = WorkerCore(spec.plan, spec.config, spec.worker_id, self._restarted)
            self._inbox = Inbox(self._core)
        self._inbox.start(requests)
        return self._incarnation, await self._inbox.collect(wait)

    async def close(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
        if self._core is not None:
            await self._core.aclose()


@dataclasses.dataclass(slots=True)
class _Request:
    """A request for an actor: its number (unique, the actor's key for it), the key naming it
    in a crash report, the :class:`WorkerCore` method and arguments, and the future its answer
    completes."""

    number: int
    key: Any
    method: str
    args: tuple[Any, ...]
    out: Future[Any]

    def wire(self) -> tuple[int, str, tuple[Any, ...]]:
        return self.number, self.method, self.args


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


class LongPoll:
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
        self._dead: dict[int, tuple[str, list[Any]]] = {}  # actor -> (why, keys it held)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the newest request
        # the loop a flush is scheduled on (or _NO_LOOP): a request from another (a new
        # epoch's, after the old loop closed with the flush unrun) schedules its own
        self._flush_on: object = None
        self._closed = False

    @property
    def broken(self) -> bool:
        return bool(self._dead)

    def submit(
        self, seq: int, indices: Sequence[Any], samples: list[Any] | None, seeds: Seeds | None
    ) -> Future[Any]:
        with self._lock:
            worker = min(range(self.num_workers), key=self._load.__getitem__)
        return self._request(worker, ("b", seq), "batch", (seq, indices, samples, seeds))

    def next_stream(self, worker: int, opening: StreamOpen, number: int) -> Future[Any]:
        key = ("s", worker, opening.token, number)
        return self._request(worker, key, "next_stream", (opening, number))

    def open_stream(self, worker: int, opening: StreamOpen) -> Future[Any]:
        return self._request(worker, ("o", worker, opening.token), "open_stream", (opening,))

    def _request(self, worker: int, key: Any, method: str, args: tuple[Any, ...]) -> Future[Any]:
        """Queues a request for ``worker``; :meth:`_flush` sends the queue after the caller's
        event loop ends its turn (at once when called off a loop)."""
        request = _Request(next(_tokens), key, method, args, Future())
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if self._dead or self._closed:
                raise BrokenProcessPool("a Ray actor died; the workers take no more work")
            self._load[worker] += 1
            self._held[request.number] = (worker, request)
            self._outbox[worker].append(request)
            self._loop = loop
            if loop is not None and self._flush_on is loop:
                return request.out
            self._flush_on = loop
        if loop is None:
            self._flush()
        else:
            loop.call_soon(self._flush)
        return request.out

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
                out.set_result(received(value))
            else:
                out.set_exception(value)

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
                self._dead.setdefault(worker, (why, [r.key for r in lost]))
        for r in lost:
            if not r.out.done():
                r.out.set_exception(error)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        notes = []
        for worker, (why, held) in sorted(self._dead.items()):
            seqs = [key[1] for key in held if key[0] == "b"]
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


class RayWorkers:
    """The running actors of a :class:`RayEngine`: the loader's engine interface.

    Requests and answers go over Unix sockets when every actor runs on this process's node
    (:class:`~asyncloader._actor_sockets.ActorSockets`), else through Ray's calls
    (:class:`LongPoll`): :meth:`start` chooses, once the actors are placed.
    """

    def __init__(self, engine: RayEngine, options: Options, plan: BatchPlan, base_seed: int):
        self.num_workers = engine.num_workers
        self._engine = engine
        self._specs = worker_specs(options, plan, base_seed, self.num_workers)
        self._actors: list[Any] = []
        self._failures: list[Any] | None = None
        self._transport: LongPoll | ActorSockets | None = None  # once started

    @staticmethod
    def new_token() -> int:
        return next(_tokens)

    def _actor_options(self) -> dict[str, Any]:
        options = {"num_cpus": 1, **self._engine.actor_options}
        if "runtime_env" not in options:
            paths = [p for p in sys.path if p and os.path.isdir(p)]
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
        return options

    def start(self) -> None:
        """Starts the actors (a local Ray cluster first, when none is connected) and waits
        until each ran its ``worker_init_fn``; blocking. Later calls re-raise what the first
        found.

        Raises:
            Exception: The user's own exception, when a ``worker_init_fn`` raised.
            WorkerCrashedError: An actor died while starting.
        """
        if self._failures is None:
            if not ray.is_initialized():
                ray.init()
            actor = ray.remote(RayWorker).options(**self._actor_options())
            self._actors = [actor.remote(spec) for spec in self._specs]
            try:
                readies = ray.get([a.ready.remote() for a in self._actors])
            except RayActorError as exc:
                raise WorkerCrashedError(
                    f"a Ray actor died while starting: {exc} (the dataset, transform or "
                    "collate_fn could not be unpickled there, or it was killed)"
                ) from exc
            self._failures = [failure for failure, _ in readies]
            if self._engine.local_sockets and not self._restarts():
                self._transport = self._connect()
            if self._transport is None:
                self._transport = LongPoll(self._actors, [{seen} for _, seen in readies])
        for failure in self._failures:
            if failure is not None:
                failure.reraise()

    def _restarts(self) -> bool:
        """Ray restarts a dead actor (``max_restarts``): the long poll re-sends its requests."""
        return self._engine.actor_options.get("max_restarts", 0) != 0

    def _connect(self) -> ActorSockets | None:
        """Every actor serving a socket of this process, or ``None`` (and none serving one)
        when some actor is on another node or cannot reach the socket."""
        node = ray.get_runtime_context().get_node_id()
        with listening(self.num_workers) as (server, path):
            refs = [a.connect.remote(path, node) for a in self._actors]
            try:
                connected = ray.get(refs, timeout=ACCEPT_TIMEOUT_S)
                accepted = accept(server, sum(connected))
            except (GetTimeoutError, TimeoutError, RayActorError):
                return None  # an actor that connects late sees its socket closed and stops;
                # one that died is found dead on first use
        if not all(connected):
            for sock, conn in accepted.values():  # their actors see the end and stop serving
                sock.close()
                conn.close()
            return None
        return ActorSockets(accepted, self._specs[0].config.loader_name, self._why_dead)

    def _why_dead(self, worker: int) -> str:
        """Why actor ``worker``, whose socket closed, died: Ray's first line on it."""
        try:
            ray.get(self._actors[worker].ready.remote(), timeout=ACCEPT_TIMEOUT_S)
        except RayActorError as exc:
            return str(exc).splitlines()[0]
        except Exception as exc:
            return f"its socket closed ({type(exc).__name__} asking Ray why)"
        return "its socket closed"

    @property
    def processes(self) -> list[Any]:
        """None of this machine's: the workers are Ray actors."""
        return []

    @property
    def broken(self) -> bool:
        return self._transport is not None and self._transport.broken

    def submit(
        self, seq: int, indices: Sequence[Any], samples: list[Any] | None, seeds: Seeds | None
    ) -> Future[Any]:
        return self._started().submit(seq, indices, samples, seeds)

    def next_stream(self, worker: int, opening: StreamOpen, number: int) -> Future[Any]:
        return self._started().next_stream(worker, opening, number)

    def open_stream(self, worker: int, opening: StreamOpen) -> Future[Any]:
        return self._started().open_stream(worker, opening)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        return "" if self._transport is None else self._transport.describe_crash(inflight)

    def _started(self) -> LongPoll | ActorSockets:
        if self._transport is None:
            raise BrokenProcessPool("the Ray actors are not started")
        return self._transport

    def shutdown(self, grace: float = 5.0) -> None:
        """Stops the actors' work, lets each exit (killed after ``grace`` seconds) and waits
        until they are gone. Idempotent; blocking."""
        transport = self._transport
        if transport is not None:
            transport.stop()
        try:
            self._stop_actors(grace)
        finally:
            if transport is not None:
                transport.close()

    def _stop_actors(self, grace: float) -> None:
        actors, self._actors = self._actors, []
        if not actors or not ray.is_initialized():
            return
        closing = [a.close.remote() for a in actors]
        ray.wait(closing, num_returns=len(closing), timeout=grace)
        exits = [a.__ray_terminate__.remote() for a in actors]
        _, late = ray.wait(exits, num_returns=len(exits), timeout=grace)
        for a in actors:
            ray.kill(a, no_restart=True)
        ray.wait(late, num_returns=len(late), timeout=grace)
