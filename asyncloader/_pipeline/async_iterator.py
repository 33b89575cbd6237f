"""The async iteration of one epoch: ``async for batch in loader`` on the running loop.

Breaking out of ``async for`` drops the iterator; its finalizer cancels the epoch's task,
whose ``finally`` joins the epoch's threads and processes on the loop
(``await loader.aclose()`` waits for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

from asyncloader._base import EMPTY, finalize_here, profiled_wait, tracing
from asyncloader._pipeline.device import hand_over
from asyncloader._pipeline.epoch import Epoch
from asyncloader._tuning import LoaderStats, now


class AsyncIterator:
    """One epoch consumed with ``async for`` on the running loop."""

    def __init__(self, epoch: Epoch, timeout: float, owner: object = None) -> None:
        self._epoch = epoch
        # The loader: an iterator keeps it alive, so a loader referenced only by its iterator
        # (``for b in AsyncLoader(...)``) does not close its persistent workers under it.
        self._owner = owner
        self._timeout = timeout or None
        self._started = False
        self._done = False
        # Until it starts, dropping the iterator shuts down the workers forked at aiter().
        self._finalizer: weakref.finalize[..., Any] | None = finalize_here(self, epoch.abandon)
        self._closing: asyncio.Future[None] | None = None  # a close begun by a timeout

    def __aiter__(self) -> AsyncIterator:
        return self

    async def __anext__(self) -> Any:
        while True:
            seq, item = await self._receive()
            batch = self._epoch.outcome(seq, item)  # raises a failed batch's error
            if batch is not EMPTY:
                return hand_over(batch)

    async def _receive(self) -> tuple[int, Any]:
        """The next ``(seq, batch)``, recorded as received and its permit returned.

        Liveness: every batch :meth:`Epoch.next` returns has its permit returned here before
        anything else can raise (``outcome`` raises a failed batch's error after), so a
        Failure or an emptied batch frees its slot as a good one does; every other exit
        (end, error, timeout, cancellation) closes the epoch."""
        if self._done:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            if self._finalizer is not None:
                self._finalizer.detach()
            task = self._epoch.start()
            loop = asyncio.get_running_loop()
            self._finalizer = finalize_here(self, _cancel_threadsafe, loop, task)
        self._epoch.asked()
        asked, began = now(), tracing.clock()
        try:
            async with asyncio.timeout(self._timeout) as deadline:
                with profiled_wait(self._received_count):
                    seq, batch = await self._epoch.next()
                tracing.waited(began, seq)
        except TimeoutError:
            if not deadline.expired():
                await self.aclose()
                raise
            # Raise now; the epoch closes in the background (aclose() waits for it).
            error = self._epoch.timed_out()
            self._done = True
            self._closing = asyncio.ensure_future(self._epoch.aclose())
            raise error from None
        except StopAsyncIteration:
            self._epoch.progress.finish()
            await self.aclose()
            raise
        except BaseException:
            await self.aclose()
            raise
        self._epoch.meter.received(asked, seq)
        self._epoch.release()
        self._epoch.progress.delivered(seq)
        return seq, batch

    def _received_count(self) -> int:
        return self._epoch.progress.batches

    @property
    def stats(self) -> LoaderStats:
        return self._epoch.stats

    @property
    def _workers(self) -> list[Any]:
        """DataLoader's (private, read by code written for DataLoader): the epoch's worker
        processes once it has started (``[]`` before its first batch is asked for)."""
        return self._epoch.worker_processes()

    async def aclose(self) -> None:
        """Cancels the epoch and waits until its threads and processes are joined. Idempotent."""
        self._done = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._closing is not None:
            await self._closing
        await self._epoch.aclose()

    async def __aenter__(self) -> AsyncIterator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _cancel_threadsafe(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Finalizer of a dropped async iterator (``break``): cancel its epoch; cleanup runs there."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(task.cancel)
