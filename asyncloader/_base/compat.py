"""Every use of a private or version-dependent API of torch, multiprocessing and concurrent.futures
(and of s3fs, an optional extra).

Checked against CPython 3.11-3.13, torch 2.2-2.13 (the CPU wheel pinned in constraints.txt) and
s3fs 2024.2-2026.9.
Each helper degrades to a safe answer when the attribute it reads is missing, so a new release
that renames one loses a diagnostic, never a batch. Nothing else in asyncloader reaches into
these libraries' underscored names.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import multiprocessing
import multiprocessing.util
import os
import socket
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import Any, TypeVar

import torch
import torch.multiprocessing  # registers torch's shared-memory tensor pickling
from torch.utils.data._utils import collate as _torch_collate  # private: torch 2.2-2.13
from torch.utils.data._utils import worker as _torch_worker  # private: torch 2.2-2.13
from torch.utils.data.sampler import BatchSampler, RandomSampler

T = TypeVar("T")


def set_torch_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """Makes ``torch.utils.data.get_worker_info()`` answer inside an asyncloader worker.

    Datasets written for DataLoader rely on it, and ``default_collate`` then stacks straight into
    shared memory (one copy less). ``_worker_info`` is the module global torch's own workers set.
    """
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


def empty_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose storage is in shared memory from the start (what
    ``default_collate`` does in a worker: ``TypedStorage._new_shared``), so filling it is the
    only copy; ``torch.empty(...).share_memory_()`` would copy it once more. Falls back to that
    where the private method is missing."""
    try:
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(math.prod(shape))
    except AttributeError:
        shared: torch.Tensor = torch.empty(shape, dtype=dtype).share_memory_()
        return shared
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """An uninitialised ``UntypedStorage`` of ``nbytes`` in shared memory from the start
    (``UntypedStorage._new_shared``); ``UntypedStorage(nbytes).share_memory_()`` where missing."""
    storage: torch.UntypedStorage
    try:
        storage = torch.UntypedStorage._new_shared(nbytes)
    except AttributeError:
        storage = torch.UntypedStorage(nbytes).share_memory_()
    return storage


def storage_users(storage: torch.UntypedStorage) -> int | None:
    """How many tensors and storage objects hold ``storage`` (its C++ use count, ``storage``
    itself included), or ``None`` where torch cannot say (``_storage_Use_Count``)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return int(count(storage._cdata))


def collate_with(batch: Any, overrides: dict[type, Callable[..., Any]]) -> Any:
    """``default_collate(batch)`` with ``overrides`` in place of some of its per-type functions
    (torch's ``collate(batch, collate_fn_map=...)``); each override is called as torch calls
    its own, and receives the original under ``default`` where there is one."""
    table = dict(_torch_collate.default_collate_fn_map)
    for kind, fn in overrides.items():
        original = table.get(kind)
        table[kind] = functools.partial(fn, default=original) if original else fn
    return _torch_collate.collate(batch, collate_fn_map=table)


def pool_processes(executor: ProcessPoolExecutor) -> dict[int, Any]:
    """pid -> ``multiprocessing.Process`` of the executor's live workers (``_processes``).

    The executor forgets a process once it died or the executor shut down: callers keep a copy
    to report exit codes and to join them.
    """
    return dict(getattr(executor, "_processes", None) or {})


def pool_is_broken(executor: ProcessPoolExecutor) -> bool:
    """A worker died and the executor accepts no more work (``_broken``)."""
    return bool(getattr(executor, "_broken", False))


def pool_manager_thread(executor: ProcessPoolExecutor) -> threading.Thread | None:
    """The thread that feeds the executor's workers and reaps them
    (``_executor_manager_thread``)."""
    return getattr(executor, "_executor_manager_thread", None)


def is_mp_context(value: Any) -> bool:
    """``value`` is a multiprocessing context (``multiprocessing.context.BaseContext`` is not
    re-exported by the package, only reachable through its ``context`` module)."""
    return isinstance(value, multiprocessing.context.BaseContext)


def forking_reducers() -> dict[type, Any]:
    """The reductions ``multiprocessing``'s pickler adds to copyreg's (``ForkingPickler.
    _extra_reducers``: sockets, connections, torch's tensors and storages)."""
    from multiprocessing.reduction import ForkingPickler

    return dict(getattr(ForkingPickler, "_extra_reducers", {}))


def s3fs_client(fs: Any) -> Any:
    """The aiobotocore client of an s3fs filesystem (``_s3``; it owns the connection pool), or
    ``None`` for other filesystems."""
    return getattr(fs, "_s3", None)


async def s3fs_read_range(fs: Any, path: str, start: int, end: int, if_match: str) -> bytes:
    """Bytes ``[start, end)`` of an s3fs object, by a GetObject with ``IfMatch`` (which
    ``_cat_file`` does not take), through s3fs's own request path (``_call_s3``: its client for
    the bucket's region, its extra request arguments such as SSE-C keys, its error
    translation). A changed object fails with the store's 412 in the cause chain."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    resp = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=if_match,
        **extra,
    )  # fmt: skip
    try:
        data: bytes = await resp["Body"].read()
        return data
    finally:
        resp["Body"].close()


_registered: set[tuple[int, Callable[[], None]]] = set()


def before_exit(hook: Callable[[], None]) -> None:
    """Calls ``hook`` at this process's exit, before it waits for its child processes and for
    executors' threads. Idempotent per process and hook.

    At interpreter exit CPython first runs ``threading``'s exit hooks (``_register_atexit``,
    last registered first: so before ``concurrent.futures``' own, which waits for an
    executor's pending work), then ``atexit``. A ``multiprocessing`` child instead ends in
    ``multiprocessing.util._exit_function``, which runs the ``Finalize`` objects of priority
    >= 0 and then joins every child process before ``threading``'s hooks (a pool's workers wait
    for work for ever, so such a child would never exit). ``hook`` is registered with both, in
    the calling process (a forked child starts with an empty ``Finalize`` registry: call this
    where the resource is made, not at import). Checked against CPython 3.11-3.13.
    """
    pid = os.getpid()
    if (pid, hook) in _registered:
        return
    _registered.add((pid, hook))

    def in_this_process() -> None:
        # A forked child inherits threading's exit hooks: there they are not its to run.
        if os.getpid() == pid:
            hook()

    threading._register_atexit(in_this_process)  # type: ignore[attr-defined]
    multiprocessing.util.Finalize(None, in_this_process, exitpriority=100)


def start_fork_server() -> None:
    """Starts multiprocessing's fork server if it is not running (``forkserver.ensure_running``,
    not documented). Returns once the server process exists, before its preload imports end."""
    from multiprocessing import forkserver

    forkserver.ensure_running()


def caller_frames(skip: int = 1) -> Iterator[FrameType]:
    """The calling thread's frames, innermost first, from ``skip`` frames above the caller
    (``sys._getframe``: a CPython implementation detail)."""
    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def thread_frames() -> dict[int, FrameType]:
    """Each running thread's innermost frame, by ``threading.get_ident()`` (``sys._current_frames``:
    a CPython implementation detail, present in 3.11-3.13); ``{}`` where it is missing."""
    current = getattr(sys, "_current_frames", None)
    return current() if current is not None else {}


def thread_pools_locked() -> bool:
    """The lock every ``ThreadPoolExecutor.submit`` takes (``_global_shutdown_lock``, not
    documented) is held now, by some thread: a thread that waits for another thread's submit
    must not wait while it may be the holder."""
    from concurrent.futures import thread

    lock = getattr(thread, "_global_shutdown_lock", None)
    return lock is not None and lock.locked()


#: Linux's ``struct ucred`` (``pid_t pid; uid_t uid; gid_t gid``), what ``SO_PEERCRED`` gives.
_UCRED = struct.Struct("iII")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of connected Unix socket ``sock``, as the
    kernel recorded it at connect time (``SO_PEERCRED``); ``None`` off Linux, where the option
    is missing or its structure differs (OpenBSD's puts the uid first)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return int(_UCRED.unpack(raw)[1])


def shuffled_batches(batch_sampler: Any) -> Iterator[list[int]] | None:
    """torch's own ``BatchSampler`` over its own ``RandomSampler`` (no replacement, one
    permutation an epoch: what ``shuffle=True`` builds), iterated as torch 2.13 iterates it
    (``tests/integration/base/test_shuffled_batches.py`` compares the two, so a release that
    changes torch's draws fails there): the same batches from the same generator draws, made
    at the same points (the permutation at the first batch, the trailing ``randperm`` torch
    draws for ``num_samples % n`` when the permutation runs out). Each batch is sliced from the
    permutation, where torch turns the whole permutation into a Python list before the first
    batch (15 ms for 262,144 samples, 40-55 ms for a million) and steps a generator per index.
    ``None`` for any other sampler, a subclass included: iterate it as it is."""
    if type(batch_sampler) is not BatchSampler or type(batch_sampler.sampler) is not RandomSampler:
        return None
    sampler = batch_sampler.sampler
    n = len(sampler.data_source)
    if sampler.replacement or n == 0 or sampler.num_samples != n:
        return None
    return _sliced_permutation(sampler, n, batch_sampler.batch_size, batch_sampler.drop_last)


def _sliced_permutation(
    sampler: RandomSampler, n: int, size: int, drop_last: bool
) -> Iterator[list[int]]:
    generator = sampler.generator
    if generator is None:  # as RandomSampler.__iter__: a generator seeded from the global RNG
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    permutation = torch.randperm(n, generator=generator)
    full = n - n % size
    for start in range(0, full, size):
        yield permutation[start : start + size].tolist()
    torch.randperm(n, generator=generator)  # torch's draw for num_samples % n (0 here)
    if full < n and not drop_last:
        yield permutation[full:].tolist()


def outside_the_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` called on an event loop's thread as if no loop ran there: user code (a
    dataset's ``__getitems__`` made on the loader's loop) that calls ``asyncio.run()`` or
    checks for a running loop behaves as it does in a plain thread. The thread's running
    loop and current event loop (``asyncio.events._set_running_loop``, for loop
    implementers) are put back afterwards, also after an ``asyncio.run()`` inside cleared
    them."""
    loop = asyncio.get_running_loop()
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(None)
    try:
        return fn(*args)
    finally:
        asyncio.set_event_loop(loop)
        asyncio.events._set_running_loop(loop)


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Warns at the innermost frame outside asyncloader: the user's line, whatever path
    inside the package led here. Frames are told by their module's name, so code that
    dataclasses generate for the package (file ``<string>``) counts as the package's. With no
    such frame (a thread of the package), at the caller."""
    frame: FrameType | None = sys._getframe(0)
    level = 1
    while frame is not None and _in_package(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)


def _in_package(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and (name == "asyncloader" or name.startswith("asyncloader."))


def profiled_wait(batch: Callable[[], int]) -> contextlib.AbstractContextManager[Any]:
    """A ``torch.profiler`` range named ``asyncloader: wait for batch <batch()>`` while a
    profiler records (so its trace shows the data stalls beside the step), else a no-op: one
    check of torch's private flag (``torch._C._autograd._profiler_enabled``, torch 2.x);
    ``batch`` is called only while one records."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(f"asyncloader: wait for batch {batch()}")
    return contextlib.nullcontext()
