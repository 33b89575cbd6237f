"""Requests to fetching workers and their answers, over one connection per worker.

The part of a :class:`~asyncloader._engines.engine.WorkerEngine` that does not depend on how its
workers were started: :class:`Channels` sends each request down the chosen worker's
connection (a ``multiprocessing`` pipe to a local worker process, a Unix socket to a Ray actor
on this machine), and one receiver thread waits on every connection, completes the request
futures, and when a worker dies fails every request still pending with
``BrokenProcessPool``, as a broken ``ProcessPoolExecutor`` does (the epoch then raises
:class:`~asyncloader.errors.WorkerCrashedError` naming the worker, how it died and the
batches it held). The worker's side is :func:`asyncloader._worker.loop.serve`.

A worker is dead once its connection closed and, where the worker has a sentinel (a process
of this machine), once that sentinel fired.
"""

from __future__ import annotations

import itertools
import selectors
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.reduction import ForkingPickler
from typing import Any

from asyncloader._base import tracing
from asyncloader._engines.requests import Requests, ToWorker, complete
from asyncloader._worker import (
    STOP,
    Keyed,
    NextOfStream,
    Request,
    RunBatch,
    batch_of,
    read_answer,
)

_tokens = itertools.count()
_keys = itertools.count()


class Channels(Requests):
    """Requests to ``num_workers`` workers and their answers; subclasses start the workers
    (filling :attr:`_conns`, then calling :meth:`_listen`) and say how one died.

    Thread-safe: requests come from the epoch's loop, answers complete on the receiver thread.

    Liveness: every request future completes, exactly one way: its answer (:meth:`_take`),
    ``BrokenProcessPool`` when its worker dies (:meth:`_died`: connection closed and sentinel
    fired), cancelled by :meth:`_stop_requests`, or :meth:`_request` raising (nothing
    pending is left after a failed send). ``_dead`` and ``_closing`` are read under the lock
    that adds to ``_pending``, so no request is added after the sweep that would fail it; the
    receiver completes futures with :func:`~asyncloader._engines.requests.complete`, so a
    waiter's cancel never raises in it and stops it.
    """

    def __init__(self, num_workers: int, loader_name: str) -> None:
        self.num_workers = n = num_workers
        self._loader_name = loader_name
        self._conns: list[Any] = []
        self._send_locks = [threading.Lock() for _ in range(n)]
        self._lock = threading.Lock()  # guards the four below
        self._pending: dict[int, tuple[int, Future[Any], Request]] = {}  # key -> ...
        self._load = [0] * n
        self._dead: dict[int, tuple[Any, list[Request]]] = {}  # id -> how, what it held
        self._closing = False
        self._receiver: threading.Thread | None = None

    # -- what subclasses say -------------------------------------------------------------------

    def _sentinel(self, i: int) -> Any:
        """What becomes ready when worker ``i`` exits, or ``None``: its connection closing
        is then its death."""
        return None

    def _how_died(self, i: int) -> Any:
        """How worker ``i`` died (blocking: may reap it), for :meth:`_death_note`."""
        return None

    def _death_note(self, i: int, how: Any, held: str) -> str:
        """One sentence: worker ``i`` died ``how`` while running ``held``."""
        return f"{self._loader_name} worker {i} died while running {held}"

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def broken(self) -> bool:
        """A worker died: the group takes no more work."""
        return bool(self._dead)

    def _listen(self) -> None:
        """Starts the receiver thread, once :attr:`_conns` holds every worker's connection."""
        self._receiver = threading.Thread(
            target=self._receive, name="asyncloader-receiver", daemon=True
        )
        self._receiver.start()

    def _stop_requests(self) -> bool:
        """Fails nothing more, cancels what is pending and asks every worker to stop; ``False``
        when it was done already."""
        with self._lock:
            if self._closing:
                return False
            self._closing = True
            pending, self._pending = self._pending, {}
        for _, future, _ in pending.values():
            future.cancel()
        for i, conn in enumerate(self._conns):
            try:
                with self._send_locks[i]:
                    conn.send(STOP)
            except (OSError, ValueError):
                pass
        return True

    def _join_receiver(self) -> None:
        receiver = self._receiver
        if receiver is not None and receiver is not threading.current_thread():
            receiver.join()

    # -- requests ------------------------------------------------------------------------------

    @staticmethod
    def new_token() -> int:
        return next(_tokens)

    def _request(self, worker: int, request: Request) -> Future[Any]:
        future: Future[Any] = ToWorker(worker)
        message = Keyed(next(_keys), request, tracing.ACTIVE is not None)  # answered by key
        key = message.key
        with self._lock:
            if self._dead or self._closing:
                raise BrokenProcessPool("a worker process died; the workers take no more work")
            self._pending[key] = (worker, future, request)
            self._load[worker] += 1
        try:
            self._send(worker, message)
        except BaseException:
            with self._lock:
                self._pending.pop(key, None)
                self._load[worker] -= 1
            raise
        return future

    def _send(self, worker: int, message: Keyed) -> None:
        try:
            with self._send_locks[worker]:
                self._conns[worker].send(message)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise BrokenProcessPool(f"worker {worker} is gone") from exc

    # -- the receiver thread -------------------------------------------------------------------

    def _receive(self) -> None:
        """Runs until every worker's connection closed and every sentinel fired.

        One selector for the thread's life (``multiprocessing.connection.wait``, and so a
        connection's ``poll()``, builds one per call): one answer is taken per readiness, and
        a dead worker's connection is drained of what it sent before it died.
        """
        with selectors.DefaultSelector() as selector:
            sentinels = {}
            for i, conn in enumerate(self._conns):
                selector.register(conn, selectors.EVENT_READ, (i, conn))
                sentinels[i] = self._sentinel(i)
                if sentinels[i] is not None:
                    selector.register(sentinels[i], selectors.EVENT_READ, (i, None))
            listening = set(range(self.num_workers))  # workers whose connection is registered
            while selector.get_map():
                for key, _ in selector.select():
                    i, conn = key.data
                    if conn is not None:
                        if i in listening and not self._take(i, conn):
                            selector.unregister(conn)
                            listening.discard(i)
                            if sentinels[i] is None:
                                self._died(i)
                        continue
                    selector.unregister(key.fileobj)
                    if i in listening:  # what it sent before it died
                        conn = self._conns[i]
                        self._drain(i, conn)
                        selector.unregister(conn)
                        listening.discard(i)
                    self._died(i)

    def _drain(self, i: int, conn: Any) -> bool:
        """Takes every answer waiting on worker ``i``'s connection; ``False`` once closed."""
        while True:
            if not self._take(i, conn):
                return False
            if not conn.poll():
                return True

    def _take(self, i: int, conn: Any) -> bool:
        """Receives one answer from worker ``i``; ``False`` when its connection is closed.

        An answer is its request's key, then the pickled result: a result that cannot be
        rebuilt here (its shared memory gone, say) fails its own request only.
        """
        try:
            key, payload = read_answer(conn.recv_bytes())
        except (EOFError, OSError):
            return False
        try:
            result = tracing.absorb(ForkingPickler.loads(payload))  # a worker's events
            error = None
        except Exception as exc:
            result, error = None, exc
        with self._lock:
            entry = self._pending.pop(key, None)
            if entry is not None:
                self._load[entry[0]] -= 1
        if entry is not None:
            complete(entry[1], result, error)
        return True

    def _died(self, i: int) -> None:
        with self._lock:
            if self._closing:
                # shutdown() reaps it: two threads reading one forkserver sentinel race, and
                # the loser would record exit code 255 for a worker that exited with 0
                return
        how = self._how_died(i)
        with self._lock:
            if self._closing:
                return
            held = [request for w, _, request in self._pending.values() if w == i]
            self._dead[i] = (how, held)
            pending, self._pending = self._pending, {}
            self._load = [0] * self.num_workers
        error = BrokenProcessPool(f"worker {i} died")
        for _, future, _ in pending.values():
            complete(future, None, error)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        """Names the workers that died, how, and the batches each held."""
        notes = []
        for i, (how, held) in sorted(self._dead.items()):
            seqs = [r.seq for r in held if isinstance(r, RunBatch)]
            streams = [batch_of(r) for r in held if isinstance(r, NextOfStream)]
            if seqs:
                what = ", ".join(
                    f"batch {seq} (indices {list(inflight.get(seq, ()))[:16]})" for seq in seqs[:4]
                )
            elif streams:
                what = f"batch {streams[0]} of its own iteration of the source"
            else:
                what = "no batch"
            notes.append(self._death_note(i, how, what))
        return "; ".join(notes)
