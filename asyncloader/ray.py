"""Workers on a Ray cluster: ``AsyncLoader(dataset, ..., engine=RayEngine(num_workers=N))``.

Each worker is a Ray actor running the same pipeline as a local ``fetch_in_workers=True``
worker (:class:`asyncloader._worker_loop.WorkerCore` on the actor's event loop): it fetches,
transforms and collates the batches it is given, or iterates its own copy of an iterable
source. The dataset, ``transform`` and ``collate_fn`` reach each actor once, when it starts;
a request carries only indices. Batches come back through Ray's object store; numpy arrays
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

    async def batch(
        self, seq: int, indices: Sequence[Any], samples: list[Any] | None, seeds: Seeds | None
    ) -> Any:
        return await self._ready_core().batch(seq, indices, samples, seeds)

    async def next_stream(self, opening: StreamOpen, number: int) -> Any:
        return await self._ready_core().next_stream(opening, number)

    async def open_stream(self, opening: StreamOpen) -> Any:
        return await self._ready_core().open_stream(opening)

    async def close(self) -> None:
        if self._core is not None:
            await self._core.aclose()


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
        ref = self._actors[worker].batch.remote(seq, indices, samples, seeds)
        return self._track(worker, ("b", seq), ref)

    def next_stream(self, worker: int, opening: StreamOpen, number: int) -> Future[Any]:
        ref = self._actors[worker].next_stream.remote(opening, number)
        return self._track(worker, ("s", worker, opening.token, number), ref)

    def open_stream(self, worker: int, opening: StreamOpen) -> Future[Any]:
        ref = self._actors[worker].open_stream.remote(opening)
        return self._track(worker, ("o", worker, opening.token), ref)

    def _track(self, worker: int, key: Any, ref: Any) -> Future[Any]:
        out: Future[Any] = Future()
        with self._lock:
            if self._dead or self._closed:
                raise BrokenProcessPool("a Ray actor died; the workers take no more work")
            self._load[worker] += 1
            self._held[key] = worker

        def done(answer: Future[Any]) -> None:
            with self._lock:
                self._load[worker] -= 1
                self._held.pop(key, None)
            if out.done():
                return
            try:
                result = answer.result()
            except RayActorError as exc:
                with self._lock:
                    held = [k for k, w in self._held.items() if w == worker] + [key]
                    self._dead.setdefault(worker, (str(exc).splitlines()[0], held))
                out.set_exception(BrokenProcessPool(f"Ray actor {worker} died"))
            except BaseException as exc:  # Ray's own failure (the object lost...)
                out.set_exception(exc)
            else:
                out.set_result(received(result))

        ref.future().add_done_callback(done)
        return out

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
