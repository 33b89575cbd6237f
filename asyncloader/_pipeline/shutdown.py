"""Stopping what a loader keeps across epochs: its running epochs and iterators, its loop
thread and its persistent workers (``AsyncLoader.close()``, ``aclose()`` and its finalizer)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

from asyncloader._base import run_in_thread, unsafe_to_wait
from asyncloader._engines import Workers
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.sync_iterator import LoopThread, SyncIterator


def release(workers: Workers, loop_thread: LoopThread, warn: bool = False) -> None:
    """Stops what a loader keeps across epochs: its loop thread (the ``for`` epochs still on it
    are cancelled and closed), then its persistent workers. Also the loader's finalizer, which
    garbage collection may run on any thread, also one the loop thread waits for, or while a
    lock the loop thread needs is held: the loop thread is joined only from close() or, for
    a loader that simply went out of scope, from the main thread where that is safe
    (:func:`~asyncloader._base.threads.unsafe_to_wait`)."""
    main = threading.current_thread() is threading.main_thread()
    loop_thread.stop(wait=not warn or (main and not unsafe_to_wait()))
    workers.close(warn)


def close_loader(
    iterators: Iterable[SyncIterator],
    epochs: Iterable[Epoch],
    workers: Workers,
    loop_thread: LoopThread,
) -> None:
    """Closes the ``for`` iterators, the workers of ``async for`` epochs never iterated, then
    what the loader keeps across epochs (:func:`release`)."""
    for it in list(iterators):
        it.close()
    for epoch in list(epochs):  # an async epoch never iterated: its workers
        epoch.abandon()
    release(workers, loop_thread)


async def aclose_loader(
    iterators: Iterable[SyncIterator],
    epochs: Iterable[Epoch],
    workers: Workers,
    loop_thread: LoopThread,
) -> None:
    """Closes every running epoch (those on the running loop awaited here, the others from
    a reaper thread) and what the loader keeps across epochs, waiting until their threads
    and processes are joined."""
    loop = asyncio.get_running_loop()
    for epoch in list(epochs):
        if epoch.loop is loop:
            await epoch.aclose()
    for it in list(iterators):
        await run_in_thread(it.close, "asyncloader-reaper")
    for epoch in list(epochs):  # an async epoch never iterated: its workers
        await run_in_thread(epoch.abandon, "asyncloader-reaper")
    await run_in_thread(lambda: release(workers, loop_thread), "asyncloader-reaper")
