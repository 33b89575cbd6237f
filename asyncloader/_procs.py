"""asyncloader's workers that fetch: processes with an event loop each, many batches in flight.

The local :class:`~asyncloader._engine.Engine` of ``fetch_in_workers=True``. Each worker runs
:func:`asyncloader._worker_loop.serve` and talks to the training process over a pipe of its
own, so one worker holds as many batches at once as its share of ``io_concurrency`` keeps
busy (a ``ProcessPoolExecutor`` gives each worker one task at a time), and a request can go
to a chosen worker (an iterable source's batches come from each worker's own iteration).

A batch goes to the worker holding the fewest. One receiver thread in the training process
waits on every pipe and every process sentinel: it completes the request futures, and when a
worker dies it fails every request still pending with ``BrokenProcessPool``, as a broken
``ProcessPoolExecutor`` does (the epoch then raises :class:`~asyncloader.errors.
WorkerCrashedError` naming the worker, how it died and the batches it held).

Start-up and shutdown are blocking and run off the event loop, with
:class:`~asyncloader._pool.ProcessPool`'s rules: stop, grace, terminate, kill, join.
"""

from __future__ import annotations

import itertools
import os
import selectors
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

from asyncloader._compat import before_exit
from asyncloader._options import Options
from asyncloader._plan import BatchPlan
from asyncloader._pool import EXIT_GRACE_S, SHUTDOWN_GRACE_S, death_note, stop_processes
from asyncloader._seeding import Seeds
from asyncloader._start_method import check_start, default_mp_context
from asyncloader._worker_loop import StreamOpen, WorkerConfig, WorkerSpec, serve
from asyncloader.errors import WorkerCrashedError

_live: weakref.WeakSet[WorkerGroup] = weakref.WeakSet()
_tokens = itertools.count()


def _shut_down_live() -> None:
    for group in list(_live):
        group.shutdown(EXIT_GRACE_S)


def worker_config(options: Options, share: int) -> WorkerConfig:
    """The worker configuration of a loader whose workers each fetch ``share`` samples at
    once (at most, under ``io_concurrency="auto"``, with their share of the budget)."""
    budget = None
    if options.auto_io and options.memory_budget is not None:
        budget = max(1, options.memory_budget * share // max(1, options.io_concurrency))
    return WorkerConfig(
        kind=options.kind,
        io_limit=share,
        fetch_threads=options.fetch_threads,
        batch_size=options.batch_size,
        drop_last=options.drop_last,
        loader_name=options.loader_name,
        io_budget=budget,
    )


def worker_specs(options: Options, plan: BatchPlan, base_seed: int, n: int) -> list[WorkerSpec]:
    """What each of ``n`` fetching workers starts with: ``io_concurrency`` split among them
    (the first get one more)."""
    total = options.io_concurrency
    return [
        WorkerSpec(
            i,
            n,
            base_seed,
            plan,
            options.worker_init_fn,
            worker_config(options, total // n + (i < total % n)),
        )
        for i in range(n)
    ]


class WorkerGroup:
    """``num_workers`` fetching worker processes (see the module docstring).

    Args:
        options: The loader's options.
        plan: Sent to each worker once, at start (it holds the dataset).
        base_seed: Worker ``i`` seeds its RNGs with ``base_seed + i``.
        ctx: The multiprocessing context; default ``options.mp_context`` or
            :func:`default_mp_context`.
    """

    def __init__(self, options: Options, plan: BatchPlan, base_seed: int, ctx: Any = None) -> None:
        ctx = ctx or options.mp_context or default_mp_context()
        check_start(ctx)
        self.num_workers = n = options.num_workers
        self._loader_name = options.loader_name
        self._specs = worker_specs(options, plan, base_seed, n)
        self._ctx = ctx
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._send_locks = [threading.Lock() for _ in range(n)]
        self._lock = threading.Lock()  # guards the four below
        self._pending: dict[tuple[Any, ...], tuple[int, Future[Any]]] = {}
        self._load = [0] * n
        self._dead: dict[int, tuple[int, list[tuple[Any, ...]]]] = {}  # id -> exit code, held
        self._closing = False
        self._receiver: threading.Thread | None = None
        self._init_failures: list[Any] | None = None  # once started: per worker, or None
        self._closed = False
        _live.add(self)
        before_exit(_shut_down_live)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts every worker and waits until each has run its ``worker_init_fn`` (blocking).
        Once started (persistent workers, a later epoch), raises what it raised then.

        Raises:
            Exception: The user's own exception, when a ``worker_init_fn`` raised.
            WorkerCrashedError: A worker died while starting.
        """
        if self._init_failures is None:
            self._init_failures = self._start()
        for failure in self._init_failures:
            if failure is not None:
                failure.reraise()

    def _start(self) -> list[Any]:
        for spec in self._specs:
            theirs, ours = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(
                target=serve,
                args=(ours, os.getpid(), spec),
                daemon=True,
                name=f"asyncloader-worker-{spec.worker_id}",
            )
            proc.start()
            ours.close()
            self._procs.append(proc)
            self._conns.append(theirs)
        failures = [self._ready(i) for i in range(self.num_workers)]
        self._receiver = threading.Thread(
            target=self._receive, name="asyncloader-receiver", daemon=True
        )
        self._receiver.start()
        return failures

    def _ready(self, i: int) -> Any:
        conn, proc = self._conns[i], self._procs[i]
        if wait([conn, proc.sentinel]) and conn.poll():
            try:
                return conn.recv()[1]
            except (EOFError, OSError):
                pass
        proc.join(SHUTDOWN_GRACE_S)
        with self._lock:  # broken: a persistent group is replaced, not started again
            self._dead[i] = (proc.exitcode, [])
        raise WorkerCrashedError(
            f"{self._loader_name} worker {i} died while starting (exit code {proc.exitcode}: "
            "the dataset, transform or collate_fn could not be unpickled, or it was killed; see "
            "its log above)"
        )

    @property
    def processes(self) -> list[Any]:
        """The worker processes, once started."""
        return list(self._procs)

    @property
    def broken(self) -> bool:
        """A worker died: the group takes no more work."""
        return bool(self._dead)

    def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stops every worker and joins them and the receiver. Idempotent; blocking."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._closing = True
            pending, self._pending = self._pending, {}
        for _, future in pending.values():
            future.cancel()
        for i, conn in enumerate(self._conns):
            try:
                with self._send_locks[i]:
                    conn.send(("stop",))
            except (OSError, ValueError):
                pass
        stop_processes(self._procs, grace)
        receiver = self._receiver
        if receiver is not None and receiver is not threading.current_thread():
            receiver.join()
        for conn in self._conns:
            conn.close()
        # The Process objects stay open: an iterator's _workers may still join them and read
        # their exit codes (they release their sentinels when collected).

    # -- requests ------------------------------------------------------------------------------

    def submit(
        self, seq: int, indices: Sequence[Any], samples: list[Any] | None, seeds: Seeds | None
    ) -> Future[Any]:
        """Runs batch ``seq`` in the worker holding the fewest batches."""
        with self._lock:
            worker = min(range(self.num_workers), key=self._load.__getitem__)
        return self._request(worker, ("b", seq), ("batch", seq, indices, samples, seeds))

    def next_stream(self, worker: int, opening: StreamOpen, number: int) -> Future[Any]:
        """Batch ``number`` of ``worker``'s own iteration of an iterable source for the epoch
        ``opening`` starts (see ``WorkerCore.next_stream``)."""
        key = ("s", worker, opening.token, number)
        return self._request(worker, key, ("next", opening, number))

    def open_stream(self, worker: int, opening: StreamOpen) -> Future[Any]:
        """Opens ``worker``'s iteration for the epoch ``opening`` starts; resolves to the
        source's own state then (see ``WorkerCore.open_stream``)."""
        return self._request(worker, ("o", worker, opening.token), ("open", opening))

    @staticmethod
    def new_token() -> int:
        return next(_tokens)

    def _request(self, worker: int, key: tuple[Any, ...], message: tuple[Any, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        message = (message[0], key, *message[1:])  # answered under its key
        with self._lock:
            if self._dead or self._closing:
                raise BrokenProcessPool("a worker process died; the workers take no more work")
            self._pending[key] = (worker, future)
            self._load[worker] += 1
        try:
            self._send(worker, message)
        except BaseException:
            with self._lock:
                self._pending.pop(key, None)
                self._load[worker] -= 1
            raise
        return future

    def _send(self, worker: int, message: tuple[Any, ...]) -> None:
        try:
            with self._send_locks[worker]:
                self._conns[worker].send(message)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise BrokenProcessPool(f"worker {worker} is gone") from exc

    # -- the receiver thread -------------------------------------------------------------------

    def _receive(self) -> None:
        """Runs until every worker's pipe closed and every worker exited.

        One selector for the thread's life (``multiprocessing.connection.wait`` builds one per
        call), and a ready pipe is drained before waiting again.
        """
        with selectors.DefaultSelector() as selector:
            for i, conn in enumerate(self._conns):
                selector.register(conn, selectors.EVENT_READ, (i, conn))
                selector.register(self._procs[i].sentinel, selectors.EVENT_READ, (i, None))
            listening = set(range(self.num_workers))  # workers whose pipe is registered
            while selector.get_map():
                for key, _ in selector.select():
                    i, conn = key.data
                    if conn is not None:
                        if i in listening and not self._drain(i, conn):
                            selector.unregister(conn)
                            listening.discard(i)
                        continue
                    selector.unregister(key.fileobj)
                    if i in listening:  # what it sent before it died
                        conn = self._conns[i]
                        self._drain(i, conn)
                        selector.unregister(conn)
                        listening.discard(i)
                    self._died(i)

    def _drain(self, i: int, conn: Any) -> bool:
        """Takes every answer waiting in worker ``i``'s pipe; ``False`` once it is closed."""
        while True:
            if not self._take(i, conn):
                return False
            if not conn.poll():
                return True

    def _take(self, i: int, conn: Any) -> bool:
        """Receives one answer from worker ``i``; ``False`` when its pipe is closed.

        An answer is a header naming its request, then the pickled result: a result that
        cannot be rebuilt here (its shared memory gone, say) fails its own request only.
        """
        try:
            _, key = conn.recv()
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return False
        try:
            result = ForkingPickler.loads(payload)
            error = None
        except Exception as exc:
            result, error = None, exc
        with self._lock:
            entry = self._pending.pop(key, None)
            if entry is not None:
                self._load[entry[0]] -= 1
        if entry is not None and not entry[1].done():
            if error is not None:
                entry[1].set_exception(error)
            else:
                entry[1].set_result(result)
        return True

    def _died(self, i: int) -> None:
        with self._lock:
            if self._closing:
                # shutdown() reaps it: two threads reading one forkserver sentinel race, and
                # the loser would record exit code 255 for a worker that exited with 0
                return
        proc = self._procs[i]
        proc.join()
        with self._lock:
            if self._closing:
                return
            held = [key for key, (w, _) in self._pending.items() if w == i]
            self._dead[i] = (proc.exitcode, held)
            pending, self._pending = self._pending, {}
            self._load = [0] * self.num_workers
        error = BrokenProcessPool(f"worker {i} (pid {proc.pid}) died")
        for _, future in pending.values():
            if not future.done():
                future.set_exception(error)

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        """Names the workers that died, how, and the batches each held."""
        notes = []
        for i, (code, held) in sorted(self._dead.items()):
            seqs = [key[1] for key in held if key[0] == "b"]
            streams = [key[3] for key in held if key[0] == "s"]
            if seqs:
                what = ", ".join(
                    f"batch {seq} (indices {list(inflight.get(seq, ()))[:16]})" for seq in seqs[:4]
                )
            elif streams:
                what = f"batch {streams[0]} of its own iteration of the source"
            else:
                what = "no batch"
            notes.append(death_note(self._loader_name, self._procs[i].pid, code, what))
        return "; ".join(notes)
