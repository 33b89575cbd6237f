"""Threads the loader starts, and how the event loop waits for blocking calls without blocking.

Every thread asyncloader starts is named ``asyncloader-*`` and joined before the epoch (or the
loader) that started it is reported closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from asyncloader._base.compat import thread_pools_locked

_new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
with contextlib.suppress(ImportError):  # at import, not at the first epoch: it takes ~6 ms
    from uvloop import new_event_loop as _new_loop

T = TypeVar("T")


_gc_state = threading.local()


def _track_collection(phase: str, info: dict[str, Any]) -> None:
    _gc_state.active = phase == "start"


gc.callbacks.append(_track_collection)


def unsafe_to_wait() -> bool:
    """A finalizer may not wait for asyncloader's threads now: event loops are parked for a
    fork (:func:`loops_parked`; a finalizer that a fork hook or the fork's allocations run
    would wait for a loop that waits for the fork), or it runs inside a garbage collection
    that may have started at an allocation under the lock every thread pool's submit takes
    (``ThreadPoolExecutor.submit`` allocates its Future there), where waiting for a thread
    that submits would deadlock. An explicit ``gc.collect()`` (the lock free) may wait. Nor
    while this thread holds the lock of the loops' registry (:func:`_registry`): a collection
    that starts at an allocation there would wait for a loop thread that, ending, waits for
    that lock; nor under any other lock taken with :func:`holding`."""
    if _parked or getattr(_gc_state, "holding", False):
        return True
    return getattr(_gc_state, "active", False) and thread_pools_locked()


#: Event loops that run asyncloader code now (the loaders' loop threads, a user's loop while an
#: epoch runs on it) -> how many of asyncloader's users they have.
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()
_loops_lock = threading.Lock()
_parked = 0  # loops_parked() blocks under way


@contextlib.contextmanager
def holding(lock: threading.Lock) -> Iterator[None]:
    """``lock`` held, known to this thread's :func:`unsafe_to_wait`: for a lock that a loop
    thread may take while a finalizer on this thread would wait for that loop."""
    with lock:
        before = getattr(_gc_state, "holding", False)
        _gc_state.holding = True
        try:
            yield
        finally:
            _gc_state.holding = before


def _registry() -> contextlib.AbstractContextManager[None]:
    """``_loops_lock`` held, known to this thread's :func:`unsafe_to_wait`."""
    return holding(_loops_lock)


#: How long :func:`loops_parked` waits for a loop to reach its park (a loop never blocks
#: this long unless a callback of someone else's does).
PARK_S = 5.0


@contextlib.contextmanager
def loop_registered(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Within: ``loop`` runs asyncloader code, and :func:`loops_parked` parks it."""
    with _registry():
        _loops[loop] = _loops.get(loop, 0) + 1
    try:
        yield
    finally:
        with _registry():
            left = _loops.get(loop, 1) - 1
            if left:
                _loops[loop] = left
            else:
                _loops.pop(loop, None)


def _park(arrived: threading.Event, resume: threading.Event) -> None:
    arrived.set()
    resume.wait()


@contextlib.contextmanager
def loops_parked(timeout: float = PARK_S) -> Iterator[None]:
    """Within: every registered event loop but the caller's own waits inside a callback of
    ours, between two of its callbacks, where none of its code holds a lock (asyncloader's
    code takes a thread lock only within one callback, never across an ``await``).

    For forking: a child process inherits every lock as it was, and one held by another
    thread at that moment stays held in the child for ever. A loop that does not reach its
    park within ``timeout`` (a callback of someone else's blocks it) is not waited for.
    Meanwhile finalizers do not wait for asyncloader's threads (:func:`unsafe_to_wait`).
    """
    global _parked
    try:
        own = asyncio.get_running_loop()
    except RuntimeError:
        own = None
    with _registry():
        loops = [loop for loop in _loops if loop is not own and loop.is_running()]
        _parked += 1
    resume = threading.Event()
    arrivals = []
    for loop in loops:
        arrived = threading.Event()
        with contextlib.suppress(RuntimeError):  # closed meanwhile: it runs nothing
            loop.call_soon_threadsafe(_park, arrived, resume)
            arrivals.append(arrived)
    try:
        deadline = time.monotonic() + timeout
        for arrived in arrivals:
            arrived.wait(max(0.0, deadline - time.monotonic()))
        yield
    finally:
        resume.set()
        with _registry():
            _parked -= 1


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Within: every object is in the collector's permanent generation (``gc.freeze()``), so a
    child forked here never collects what it inherited; the parent's objects are unfrozen
    after, as they were.

    Garbage of the parent that the child collects runs its finalizers in the child, against
    state the two share: an aiohttp connector closing its sockets there unregisters them from
    the parent's epoll (one kernel object for both), whose event loop then waits for ever
    (fsspec's loop under ``datasets`` streaming; fsspec's fork hook drops the child's
    references to it, leaving it to the child's collector). Python's docs recommend freezing
    before a fork for copy-on-write too. When objects were frozen before (by the program), the
    program's choice is left alone: the garbage is collected here, in the parent, instead.
    """
    if gc.get_freeze_count():
        gc.collect()
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def finalize_here(obj: object, fn: Callable[..., Any], *args: Any) -> weakref.finalize[..., object]:
    """``weakref.finalize(obj, fn, *args)`` that calls ``fn`` only in the process that made
    it. A forked worker inherits every object of the training process; collecting one there
    must not stop, join or wait for threads and processes that are the training process's
    (in the child they do not exist, and waiting for them hangs it)."""
    return weakref.finalize(obj, _in_process, os.getpid(), fn, *args)


def _in_process(pid: int, fn: Callable[..., Any], *args: Any) -> None:
    if os.getpid() == pid:
        fn(*args)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    return _new_loop()


def settle(done: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """Completes ``done`` (on its loop) with a thread's result, unless it was cancelled."""
    if done.cancelled():
        return
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(result)


def single_threaded_torch() -> None:
    """Initializer of the loader's threads: torch work there (collate's ``torch.stack``...)
    stays on that thread instead of waking the intra-op pool, whose spinning threads compete
    with the event loop on small machines. The setting is per thread, but it also becomes
    the default of threads that have not used torch yet: see :func:`keep_torch_threads`."""
    import torch

    torch.set_num_threads(1)


def keep_torch_threads() -> None:
    """Fixes the calling (consumer's) thread's torch thread count before the loader's threads
    start. torch sets a thread's count lazily, on its first parallel op, from the last value
    any thread passed to ``torch.set_num_threads``: after :func:`single_threaded_torch` ran in
    a loader thread, a trainer thread that had not used torch's pool yet would get 1 thread.
    Reading the count sets it now, to torch's default (or the trainer's own setting)."""
    import torch

    torch.get_num_threads()


def loader_threads(max_workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool for the loader's own blocking work, named ``name``.

    Liveness: a job queued behind ``max_workers`` busy ones runs when one of them returns;
    an epoch's pools are shut down (``cancel_futures``) only by its exit stack, after every
    task that awaits their futures ended, so no awaited job is cancelled under its waiter.
    """
    return ThreadPoolExecutor(max_workers, name, initializer=single_threaded_torch)


def _outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """``fn()``'s result or exception, whichever it gave."""
    try:
        return fn(), None
    except BaseException as exc:
        return None, exc


def call_in_thread(fn: Callable[[], T], name: str) -> T:
    """Runs blocking ``fn`` on a new thread named ``name`` and waits for it (blocking).

    For work that must not run on the calling thread, e.g. ``asyncio.run`` from code that may
    itself run inside an event loop. ``fn``'s exception is raised here.
    """
    box: list[tuple[Any, BaseException | None]] = []
    thread = threading.Thread(target=lambda: box.append(_outcome(fn)), name=name, daemon=True)
    thread.start()
    thread.join()
    result, exc = box[0]
    if exc is not None:
        raise exc
    return cast("T", result)  # no exception: ``fn`` returned it


async def run_in_thread(fn: Callable[[], T], name: str) -> T:
    """Runs blocking ``fn`` on a new thread named ``name`` and awaits it without blocking the loop.

    Cancelling the awaiting task does not abandon ``fn``: the thread is joined before the
    cancellation propagates, so nothing the call was tearing down is left half done.

    Liveness: ``done`` is settled by the thread's last act on every path (``_outcome``
    catches everything), unless the loop closed, and then nobody awaits it. ``fn`` must not
    wait for this loop: a cancelled await joins the thread on the loop's own thread.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def target() -> None:
        result, exc = _outcome(fn)
        with contextlib.suppress(RuntimeError):  # the loop closed while we ran
            loop.call_soon_threadsafe(settle, done, result, exc)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        return await asyncio.shield(done)
    finally:
        # Settling ``done`` is the thread's last act, so this join is immediate unless the
        # await was cancelled, and then it waits for ``fn`` to finish, as promised above.
        thread.join()
