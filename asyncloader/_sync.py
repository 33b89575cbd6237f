"""The sync wrapper: ``for batch in loader`` runs the epoch on an event loop in a thread.

::

    consumer thread                       asyncloader-loop thread (uvloop when installed)
    ───────────────                       ───────────────────────────────────────────────
    next() ── queue.get ◄── (ITEM, batch) ── pump: await epoch.next()
           └─ call_soon_threadsafe(epoch.release)  ─►  window permit returned

The hand-over queue needs no bound of its own: every batch in it still holds a window permit,
returned only when the consumer takes the batch, so it never holds more than the window.
The pump always ends by putting END or the error, on every path (principle: end of stream
cannot be forgotten). Closing, breaking out of the loop, or dropping the iterator cancels the
pump, whose ``finally`` closes the epoch, and then joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from typing import Any

from asyncloader._device import hand_over
from asyncloader._epoch import Epoch
from asyncloader._threads import new_event_loop
from asyncloader.errors import LoaderTimeoutError

_ITEM, _END, _ERROR = 0, 1, 2


async def _pump(epoch: Epoch, out: queue.SimpleQueue[tuple[int, Any]]) -> None:
    """Moves batches from the epoch to the consumer's queue; always ends with END or ERROR."""
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


def _serve(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        pass
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _stop(
    loop: asyncio.AbstractEventLoop, task: asyncio.Task[None], thread: threading.Thread
) -> None:
    """Cancels the pump and joins the loop thread (the finalizer: holds no iterator)."""
    with contextlib.suppress(RuntimeError):  # the loop already closed: the pump is done
        loop.call_soon_threadsafe(task.cancel)
    if thread is not threading.current_thread():
        thread.join()


class SyncIterator:
    """One epoch, consumed with ``next()`` from any thread but the loader's own.

    Args:
        epoch: The epoch to run; it is started on the new loop.
        timeout: Seconds to wait for one batch, 0 for ever.
    """

    def __init__(self, epoch: Epoch, timeout: float) -> None:
        self._epoch = epoch
        self._timeout = timeout or None
        self._queue: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._loop = new_event_loop()
        task = self._loop.create_task(_pump(epoch, self._queue), name="asyncloader-pump")
        thread = threading.Thread(
            target=_serve, args=(self._loop, task), name="asyncloader-loop", daemon=True
        )
        self._done = False
        self._finalizer = weakref.finalize(self, _stop, self._loop, task, thread)
        thread.start()

    def __iter__(self) -> SyncIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            kind, payload = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            waited = self._epoch.describe_wait()
            self.close()
            raise LoaderTimeoutError(
                f"no batch within timeout={self._timeout}s while waiting for {waited}"
            ) from None
        if kind == _ITEM:
            seq, batch = payload
            self._epoch.progress.delivered(seq)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._epoch.release)
            return hand_over(batch)
        self.close()
        if kind == _ERROR:
            raise payload
        self._epoch.progress.finish()
        raise StopIteration

    @property
    def stats(self) -> Any:
        return self._epoch.stats

    def close(self) -> None:
        """Stops the epoch and joins its thread, processes and workers. Idempotent."""
        if not self._done:
            self._done = True
            self._finalizer()

    def __enter__(self) -> SyncIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
