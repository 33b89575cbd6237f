"""Workers on a Ray cluster: ``AsyncLoader(dataset, ..., engine=RayEngine(num_workers=N))``.

Each worker is a Ray actor running the same pipeline as a local ``fetch_in_workers=True``
worker (:class:`asyncloader._worker_loop.WorkerCore` on the actor's event loop): it fetches,
transforms and collates the batches it is given, or iterates its own copy of an iterable
source. The dataset, ``transform`` and ``collate_fn`` reach each actor once, when it starts;
a request carries only indices, and requests travel several to a call (see
:meth:`RayWorkers._flush`). Batches come back through Ray's object store; numpy arrays
there are read-only views of the store, so they are copied once on arrival (the batch you get
is writable and never aliases the store; tensors arrive as copies already).

The actors run on whatever nodes the connected cluster has: ``ray.init(address=...)`` first,
or a local cluster is started on first use. Ray is an optional extra (``pip install
asyncloader[ray]``), imported only by this module.

An actor that dies mid-epoch raises :class:`~asyncloader.errors.WorkerCrashedError`, as a
local worker does. With Ray's own ``max_restarts`` and ``max_task_retries`` actor options,
Ray restarts it and retries its unfinished batches instead: each batch is still delivered
once (a batch is keyed by its number, and a retry makes the same batch). A worker iterating
its own copy of an iterable source cannot be restarted in place (its position is gone): the
epoch then raises ``WorkerCrashedError``, and resuming from ``state_dict()`` continues it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from asyncloader._options import Options
from asyncloader._plan import BatchPlan
from asyncloader._procs import worker_specs
from asyncloader._seeding import Seeds
from asyncloader._skip import Trimmed
from asyncloader._structure import DESCEND, map_structure
from asyncloader._transport import TensorValue, WithArrays
from asyncloader._worker import init_failure, setup_worker
from asyncloader._worker_loop import StreamOpen, WorkerCore, WorkerSpec
from asyncloader.errors import WorkerCrashedError

__all__ = ["RayEngine"]

_tokens = itertools.count()


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

    Use ``persistent_workers=True`` with it: actors take seconds to start, and otherwise each
    epoch starts its own.
    """

    def __init__(self, num_workers: int = 2, **actor_options: Any) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        self.num_workers = num_workers
        self.actor_options = actor_options

    def bind(self, options: Options, plan: BatchPlan, base_seed: int) -> RayWorkers:
        """The actors of one loader's epoch (or of all its epochs, with persistent workers)."""
        return RayWorkers(self, options, plan, base_seed)

    def __repr__(self) -> str:
        return f"RayEngine(num_workers={self.num_workers}, **{self.actor_options!r})"


class RayWorker:
    """The actor: one worker's :class:`WorkerCore` on the actor's event loop."""

    def __init__(self, spec: WorkerSpec) -> None:
        setup_worker(
            None, spec.worker_id, spec.num_workers, spec.base_seed, spec.plan,
            spec.worker_init_fn, False,
        )  # fmt: skip
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._args = (spec.plan, spec.config, spec.worker_id, restarted)
        self._core: WorkerCore | None = None

    def _ready_core(self) -> WorkerCore:
        if self._core is None:  # on the actor's loop, which __init__ does not run on
            self._core = WorkerCore(*self._args)
        return self._core

    async def ready(self) -> Any:
        return init_failure()

    async def run(self, requests: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Runs requests (a :class:`WorkerCore` method's name and its arguments) together;
        each answer is ``(True, result)``, or ``(False, exception)`` for a request that raised
        (the others still count)."""
        core = self._ready_core()
        answers = await asyncio.gather(
            *(getattr(core, name)(*args) for name, args in requests), return_exceptions=True
        )
        return [(not isinstance(a, BaseException), a) for a in answers]

    async def close(self) -> None:
        if self._core is not None:
            await self._core.aclose()


#: Requests at most in one actor call. A call costs the training process about 1 ms of CPU
#: (Ray's task submission, then an object to fetch and unpickle) whatever it carries: see
#: ``benchmarks/probes/ray_calls.py``.
MAX_PER_CALL = 8


def per_call(held: int) -> int:
    """Requests at most in one call to an actor holding ``held`` (those queued included):
    half of them, so that the actor works on one call while the answers of another travel,
    and at most ``MAX_PER_CALL``."""
    return max(1, min(MAX_PER_CALL, held // 2))


@dataclasses.dataclass(slots=True)
class _Request:
    """A request queued for an actor: its key, the :class:`WorkerCore` method and arguments,
    and the future its answer completes."""

    key: Any
    method: str
    args: tuple[Any, ...]
    out: Future[Any]


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


class RayWorkers:
    """The running actors of a :class:`RayEngine`: the loader's engine interface.

    Thread-safe: requests come from the epoch's loop, answers complete on Ray's threads.
    """

    def __init__(self, engine: RayEngine, options: Options, plan: BatchPlan, base_seed: int):
        self.num_workers = n = engine.num_workers
        self._engine = engine
        self._specs = worker_specs(options, plan, base_seed, n)
        self._actors: list[Any] = []
        self._lock = threading.Lock()
        self._load = [0] * n
        self._held: dict[Any, int] = {}  # request key -> actor
        self._dead: dict[int, tuple[str, list[Any]]] = {}  # actor -> (why, keys it held)
        self._outbox: list[list[_Request]] = [[] for _ in range(n)]  # requests not yet sent
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the newest request
        # the loop a flush is scheduled on: a request from another (a new epoch's, after the
        # old loop closed with the flush unrun) schedules its own
        self._flush_on: asyncio.AbstractEventLoop | None = None
        self._failures: list[Any] | None = None
        self._closed = False

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
                self._failures = ray.get([a.ready.remote() for a in self._actors])
            except RayActorError as exc:
                raise WorkerCrashedError(
                    f"a Ray actor died while starting: {exc} (the dataset, transform or "
                    "collate_fn could not be unpickled there, or it was killed)"
                ) from exc
        for failure in self._failures:
            if failure is not None:
                failure.reraise()

    @property
    def processes(self) -> list[Any]:
        """None of this machine's: the workers are Ray actors."""
        return []

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
        out: Future[Any] = Future()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if self._dead or self._closed:
                raise BrokenProcessPool("a Ray actor died; the workers take no more work")
            self._load[worker] += 1
            self._held[key] = worker
            self._outbox[worker].append(_Request(key, method, args, out))
            self._loop = loop
            if loop is not None and self._flush_on is loop:
                return out
            self._flush_on = loop
        if loop is None:
            self._flush()
        else:
            loop.call_soon(self._flush)
        return out

    def _flush(self) -> None:
        """Sends each actor its queued requests in calls of :func:`per_call` requests. A
        shorter rest waits while the actor has a call's worth in flight: an answer flushes
        again (a call costs the training process as much as its requests' answers do)."""
        calls = []
        with self._lock:
            self._flush_on = None
            for worker, box in enumerate(self._outbox):
                size = per_call(self._load[worker])
                sending = len(box) - len(box) % size
                if len(box) < size and (self._load[worker] - len(box) < size or not self._loop):
                    sending = len(box)  # the actor would run short of work
                calls += [(worker, box[i : i + size]) for i in range(0, sending, size)]
                del box[:sending]
        for worker, requests in calls:
            self._call(worker, requests)

    def _flush_later(self) -> None:
        """After an answer: sends what waited for it, on the loop that queued it."""
        with self._lock:
            loop = self._loop
            if self._flush_on is loop or not any(self._outbox):
                return
            self._flush_on = loop
        try:
            if loop is None:
                raise RuntimeError("no loop")
            loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is gone: nobody waits for these answers
            with self._lock:
                self._flush_on = None

    def _call(self, worker: int, requests: list[_Request]) -> None:
        try:
            ref = self._actors[worker].run.remote([(r.method, r.args) for r in requests])
        except BaseException as exc:  # the actor handle is gone (shut down meanwhile)
            self._settle(worker, requests, exc, None)
            return
        ref.future().add_done_callback(lambda answer: self._answered(worker, requests, answer))

    def _answered(self, worker: int, requests: list[_Request], answer: Future[Any]) -> None:
        try:
            answers = answer.result()
        except RayActorError as exc:
            with self._lock:
                held = [k for k, w in self._held.items() if w == worker]
                self._dead.setdefault(worker, (str(exc).splitlines()[0], held))
            self._settle(worker, requests, BrokenProcessPool(f"Ray actor {worker} died"), None)
        except BaseException as exc:  # Ray's own failure (the object lost...)
            self._settle(worker, requests, exc, None)
        else:
            self._settle(worker, requests, None, answers)

    def _settle(
        self,
        worker: int,
        requests: list[_Request],
        error: BaseException | None,
        answers: list[tuple[bool, Any]] | None,
    ) -> None:
        with self._lock:
            self._load[worker] -= len(requests)
            for r in requests:
                self._held.pop(r.key, None)
        self._flush_later()
        for i, r in enumerate(requests):
            if r.out.done():
                continue
            if answers is None:
                r.out.set_exception(error)  # type: ignore[arg-type]
            elif answers[i][0]:
                r.out.set_result(received(answers[i][1]))
            else:
                r.out.set_exception(answers[i][1])

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

    def shutdown(self, grace: float = 5.0) -> None:
        """Stops the actors' work, lets each exit (killed after ``grace`` seconds) and waits
        until they are gone. Idempotent; blocking."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            unsent = [r for box in self._outbox for r in box]
            self._outbox = [[] for _ in range(self.num_workers)]
        for r in unsent:
            r.out.cancel()
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
