"""The Ray actor of a :class:`asyncloader.ray.RayEngine`: one worker's
:class:`~asyncloader._worker.loop.WorkerCore` on the actor's event loop, behind an :class:`Inbox`
that runs each request once by its number.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

import ray

from asyncloader._engines.ray.sockets import (
    connect_actor,
)
from asyncloader._worker import Request, WorkerCore, WorkerSpec, init_failure, setup_worker


class Inbox:
    """An actor's requests: each runs once on ``core`` (keyed by its number: a number sent
    again, by a retried call or after a restart, joins the one running or answered), and its
    answer waits until :meth:`collect` takes it. On the actor's event loop.

    Liveness: a waiting :meth:`collect` returns once an answer is there, nothing runs, or
    the inbox closes: ``_news`` is cleared after those were checked, with no await between,
    and :meth:`_finished` (each request's task, however it ends) and :meth:`close` set it.

    Args:
        core: Has ``run(request)`` (the coroutine answering it) and ``spawn(coroutine, name)``
            (a task that ``core``'s own close cancels).
    """

    def __init__(self, core: Any) -> None:
        self._core = core
        self._running: set[int] = set()
        self._answers: dict[int, tuple[bool, Any]] = {}  # request number -> answer
        self._news = asyncio.Event()
        self._closing = False

    def start(self, requests: list[tuple[int, Request]]) -> None:
        """Starts ``requests``: a number and a request each."""
        for number, request in requests:
            if number not in self._running and number not in self._answers:
                self._running.add(number)
                name = f"{type(request).__name__}:{number}"
                task = self._core.spawn(self._core.run(request), name)
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
        its ``node`` and able to reach the socket (see :mod:`asyncloader._engines.ray.sockets`)."""
        if ray.get_runtime_context().get_node_id() != node:
            return False
        spec = self._spec
        return connect_actor(path, spec.plan, spec.config, spec.worker_id)

    async def exchange(
        self, requests: list[tuple[int, Request]], wait: bool
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
