"""The running actors of a :class:`asyncloader.ray.RayEngine`: the loader's engine interface,
talking to the actors over Unix sockets or through Ray's calls (:class:`LongPoll`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from asyncloader._base import Samples, Seeds
from asyncloader._config import Options
from asyncloader._engines import worker_specs
from asyncloader._engines.ray.actor import RayWorker
from asyncloader._engines.ray.long_poll import LongPoll, _tokens
from asyncloader._engines.ray.sockets import (
    ACCEPT_TIMEOUT_S,
    ActorSockets,
    accept,
    listening,
)
from asyncloader._worker import BatchPlan, StreamOpen
from asyncloader.errors import WorkerCrashedError


class RayWorkers:
    """The running actors of a :class:`RayEngine`: the loader's engine interface.

    Requests and answers go over Unix sockets when every actor runs on this process's node
    (:class:`~asyncloader._engines.ray.sockets.ActorSockets`), else through Ray's calls
    (:class:`LongPoll`): :meth:`start` chooses, once the actors are placed.
    """

    def __init__(self, engine: Any, options: Options, plan: BatchPlan, base_seed: int):
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
        restarts: int = self._engine.actor_options.get("max_restarts", 0)
        return restarts != 0

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
        self, seq: int, indices: Sequence[Any], samples: Samples | None, seeds: Seeds | None
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
