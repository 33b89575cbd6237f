"""The sync wrapper: ``for batch in loader`` runs the epoch on the loader's event-loop thread.

::

    consumer thread                       asyncloader-loop thread (one per loader, uvloop when
    ───────────────                       installed, kept across epochs)
    next() ── queue.get ◄── (ITEM, batch) ── pump: await epoch.next()
           └─ call_soon_threadsafe(epoch.release)  ─►  window permit returned

The hand-over queue needs no bound of its own: every batch in it still holds a window permit,
returned only when the consumer takes the batch, so it never holds more than the window; and
so the pump's ``put`` never blocks, also when the consumer has left.
Liveness: while the consumer waits in ``queue.get``, the pump will put a batch, END or the
error: it puts one item per batch the epoch releases, and its ``finally`` puts the last on
every exit, cancellation included (:class:`Job` starts the coroutine before cancelling it).
Each taken batch's permit goes back through ``call_soon_threadsafe(epoch.release)``.
The pump always ends by putting END or the error, on every path (principle: end of stream
cannot be forgotten), and then sets ``finished``. Closing, breaking out of the loop, or
dropping the iterator cancels the pump, whose ``finally`` closes the epoch, and waits for
``finished``. The loop thread outlives the epoch: per-loop clients (aiohttp sessions, s3fs
filesystems) are reused by the next epoch, and closed when the loader closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from asyncloader._base import (
    EMPTY,
    finalize_here,
    loop_registered,
    new_event_loop,
    profiled_wait,
    tracing,
    unsafe_to_wait,
)
from asyncloader._pipeline.device import hand_over
from asyncloader._pipeline.epoch import Epoch
from asyncloader._tuning import now

_ITEM, _END, _ERROR = 0, 1, 2


class Job:
    """A coroutine run as a task on another thread's loop; cancellable and awaitable from any
    thread. ``done`` is set once the task has finished. The coroutine always begins, also
    when cancelled at once, so its ``finally`` always runs."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, None],
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self._coro = coro
        self.done = threading.Event()
        self._on_done = on_done
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False
        loop.call_soon_threadsafe(self._start, coro)

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task = self.loop.create_task(coro, name="asyncloader-pump")
        self._task.add_done_callback(self._finished)
        if self._cancelled:
            self._cancel_here()

    def _finished(self, _: asyncio.Task[None]) -> None:
        if self._on_done is not None:
            self._on_done()
        self.done.set()

    def _cancel_here(self) -> None:
        if self._task is None:
            return
        if inspect.getcoroutinestate(self._coro) == inspect.CORO_CREATED:
            # A task cancelled before its first step never runs its coroutine, whose
            # ``finally`` is what closes the epoch: cancel once it has begun.
            self.loop.call_soon(self._cancel_here)
            return
        self._task.cancel()

    def cancel(self) -> None:
        """Asks the task to stop (it may still be finishing when this returns). Once: the
        first request always reaches the task (:meth:`_cancel_here` waits for it to begin),
        and a second (a timeout's, then ``close()``'s) would cut into the cleanup the first
        began: the epoch's closing, which ``close()`` waits for."""
        if self._cancelled:
            return
        self._cancelled = True
        with contextlib.suppress(RuntimeError):  # the loop closed: the task is done
            self.loop.call_soon_threadsafe(self._cancel_here)


class LoopThread:
    """An event loop on one daemon thread, ``asyncloader-loop``, shared by a loader's epochs.

    Started by the first :meth:`run`; :meth:`stop` cancels what still runs there, shuts down
    its async generators (closing per-loop clients) and joins the thread. Thread-safe; a
    :meth:`run` after :meth:`stop` starts a new thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(
        self, coro: Coroutine[Any, Any, None], on_done: Callable[[], None] | None = None
    ) -> Job:
        """Runs ``coro`` on the loop (started if need be); ``on_done()`` is called there once
        it has finished, also when it was cancelled before it ran."""
        with self._lock:
            if self._loop is None:
                self._loop = new_event_loop()
                self._thread = threading.Thread(
                    target=_serve, args=(self._loop,), name="asyncloader-loop", daemon=True
                )
                self._thread.start()
            return Job(self._loop, coro, on_done)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def stop(self, wait: bool = True) -> None:
        """Stops the loop and, with ``wait``, joins its thread. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        if wait and thread is not threading.current_thread():
            thread.join()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    with loop_registered(loop):  # parked while a loader forks its workers
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


async def _pump(epoch: Epoch, out: queue.SimpleQueue[tuple[int, Any]]) -> None:
    """Moves batches (and failed batches) from the epoch to the consumer's queue; always ends
    with END or ERROR."""
    final: tuple[int, Any] = (_END, None)
    try:
        epoch.start()
        while True:
            out.put((_ITEM, await epoch.next()))
    except StopAsyncIteration:
        pass
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        final = (_ERROR, exc)
    finally:
        try:
            await epoch.aclose()
        finally:
            out.put(final)


def _stop(pump: Job, wait: bool = True) -> None:
    """Cancels the pump and, with ``wait``, waits until the epoch is closed."""
    pump.cancel()
    if wait and not _on_loop(pump.loop):
        pump.done.wait()


def _finalize(pump: Job) -> None:
    """The iterator's finalizer. It waits for the epoch to close only where that is safe: on
    the main thread (where an unreferenced iterator usually dies, and which the loop never
    waits for), and not in a garbage collection begun under a lock the loop thread needs
    (:func:`~asyncloader._base.threads.unsafe_to_wait`). Elsewhere the epoch closes in the
    background."""
    safe = threading.current_thread() is threading.main_thread() and not unsafe_to_wait()
    _stop(pump, wait=safe)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class SyncIterator:
    """One epoch, consumed with ``next()`` from any thread but the loader's own.

    Args:
        epoch: The epoch to run; it is started on ``loop``.
        timeout: Seconds to wait for one batch, 0 for ever.
        loop: The loader's loop thread.
        owner: The loader: an iterator keeps it alive, so a loader referenced only by its
            iterator (``for b in AsyncLoader(...)``) does not close its workers under it.
    """

    def __init__(
        self, epoch: Epoch, timeout: float, loop: LoopThread, owner: object = None
    ) -> None:
        self._epoch = epoch
        self._owner = owner
        self._timeout = timeout or None
        self._queue: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        # An epoch cancelled before it started opens nothing: state_dict() need not wait.
        self._pump = loop.run(_pump(epoch, self._queue), epoch.progress.source_opened)
        self._done = False
        self._finalizer = finalize_here(self, _finalize, self._pump)

    def __iter__(self) -> SyncIterator:
        return self

    def __next__(self) -> Any:
        while True:
            seq, item = self._receive()
            batch = self._epoch.outcome(seq, item)  # raises a failed batch's error
            if batch is not EMPTY:
                return hand_over(batch)

    def _receive(self) -> tuple[int, Any]:
        """The next ``(seq, batch)``, recorded as received and its permit returned."""
        if self._done:
            raise StopIteration
        self._epoch.asked()
        asked, began = now(), tracing.clock()
        try:
            with profiled_wait(self._received_count):
                kind, payload = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            # Raise now; the epoch closes in the background (close() waits for it).
            error = self._epoch.timed_out()
            self._done = True
            self._finalizer.detach()
            self._pump.cancel()
            raise error from None
        if kind == _ITEM:
            seq, item = payload
            tracing.waited(began, seq)
            self._epoch.meter.received(asked, seq)
            self._epoch.progress.delivered(seq)
            with contextlib.suppress(RuntimeError):
                self._pump.loop.call_soon_threadsafe(self._epoch.release)
            return seq, item
        self.close()
        if kind == _ERROR:
            raise payload
        self._epoch.progress.finish()
        raise StopIteration

    def _received_count(self) -> int:
        return self._epoch.progress.batches

    @property
    def stats(self) -> Any:
        return self._epoch.stats

    @property
    def _workers(self) -> list[Any]:
        """DataLoader's (private, read by code written for DataLoader): the epoch's worker
        processes (``multiprocessing.Process``), waiting for them to start."""
        return self._epoch.worker_processes()

    def close(self) -> None:
        """Stops the epoch and waits until its threads and processes are joined. Idempotent."""
        self._done = True
        self._finalizer.detach()
        _stop(self._pump)

    def __enter__(self) -> SyncIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
