"""Sources, transforms and probes shared by the tests (importable in worker processes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils import worker as torch_worker

from asyncloader._base import worker_info
from asyncloader._base.worker_info import WorkerInfo, get_worker_info
from tests.helpers.waiting import Count

MAX_LATENCY_S = 0.004


def latency(index: int) -> float:
    """A fixed pseudo-random latency per index, so samples complete out of order."""
    return random.Random(index).random() * MAX_LATENCY_S


def sample(index: int) -> np.ndarray:
    """The content of sample ``index``: its index, so delivery can be checked by content."""
    return np.full(3, index, dtype=np.int64)


class SyncSource(torch.utils.data.Dataset):
    """Map-style source with a blocking, random per-sample latency."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        time.sleep(latency(index))
        return sample(index)


class GetitemsSource(SyncSource):
    """SyncSource with ``__getitems__``: one call per batch, waiting the batch's longest
    latency. With ``log`` (a file path), each call appends a line to it, from any process:
    ``["getitems", [indices]]`` or ``["getitem", [index]]``."""

    def __init__(self, n: int = 100, log: str | None = None) -> None:
        super().__init__(n)
        self.log = log

    def __getitem__(self, index: int) -> np.ndarray:
        self._record("getitem", [index])
        return super().__getitem__(index)

    def __getitems__(self, indices: list[int]) -> list[np.ndarray]:
        self._record("getitems", indices)
        time.sleep(max((latency(i) for i in indices), default=0.0))
        return [sample(i) for i in indices]

    def _record(self, call: str, indices: list[int]) -> None:
        if self.log is not None:
            line = json.dumps([call, [int(i) for i in indices]]) + "\n"
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode())  # one write: lines of processes never interleave
            finally:
                os.close(fd)


class AsyncSource:
    """Map-style source with ``async def __getitem__`` and a random per-sample latency;
    ``calls`` counts the fetches begun (in this process), for tests to wait on."""

    def __init__(self, n: int = 100) -> None:
        self.n = n
        self.calls = Count()

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        self.calls.add()
        await asyncio.sleep(latency(index))
        return sample(index)


class Waiting:
    """Map-style source with ``async def __getitem__``: sample ``i`` is ``i``, after a fixed
    ``latency_s`` (storage that only waits)."""

    def __init__(self, n: int, latency_s: float) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(self.latency_s)
        return index


class IterSource(IterableDataset):
    """A torch IterableDataset yielding samples 0..n-1; in worker ``w`` of ``k`` iterating its
    own copy (torch's ``get_worker_info()``), those with ``i % k == w``, as DataLoader's
    documentation shards one."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return (sample(i) for i in range(first, self.n, step))

    def __len__(self) -> int:
        return self.n


class AsyncIterSource:
    """An async iterable yielding samples 0..n-1 with random latency; in worker ``w`` of ``k``
    iterating its own copy (asyncloader's ``get_worker_info()``), those with ``i % k == w``."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    async def __aiter__(self):
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(first, self.n, step):
            await asyncio.sleep(latency(i) / 4)
            yield sample(i)


@contextlib.contextmanager
def as_worker(worker_id: int, num_workers: int):
    """Within: ``get_worker_info()`` (asyncloader's and torch's) answers as worker
    ``worker_id`` of ``num_workers`` does, to iterate a worker's part of a source here."""
    saved = worker_info._info, torch_worker._worker_info
    worker_info._info = WorkerInfo(worker_id, num_workers, 0, None)
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=0, dataset=None
    )
    try:
        yield
    finally:
        worker_info._info, torch_worker._worker_info = saved


def indices_of(batches: Iterable[Any]) -> list[int]:
    """The sample indices delivered, in delivery order (from each row's content)."""
    return [int(row[0]) for batch in batches for row in batch]


def add_one(x: np.ndarray) -> np.ndarray:
    return x + 1


def jitter(x: Any) -> Any:
    """A transform that waits a random latency fixed per sample (an array's first value, or a
    dict's ``__key__`` or ``id``), up to a quarter of MAX_LATENCY_S, so batches finish out of
    order in the executor; returns ``x``."""
    name = x.get("__key__", x.get("id")) if isinstance(x, dict) else int(x[0])
    time.sleep(random.Random(name).random() * MAX_LATENCY_S / 4)
    return x


class Draws:
    """A transform that runs ``inner`` (when given) and pairs the sample with a draw from each
    global RNG (torch, random, numpy), as a random augmentation does."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner

    def __call__(self, x: Any) -> tuple[Any, tuple[float, float, float]]:
        x = self.inner(x) if self.inner is not None else x
        return x, (torch.rand(()).item(), random.random(), float(np.random.rand()))


def worker_processes() -> set[int]:
    """Live descendants of this process, except multiprocessing's per-interpreter singletons
    and servers the tests start.

    The fork server and the resource tracker are started once per interpreter by
    multiprocessing and serve every pool; the fork server's children (the workers) count.
    A server process (SeaweedFS, kept for the session) runs in a session of its own, which
    workers never do.
    """
    pids, session = set(), os.getsid(0)
    for child in psutil.Process(os.getpid()).children():
        try:
            cmdline = " ".join(child.cmdline())
            family = child.children(recursive=True)
            own_session = os.getsid(child.pid) != session
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
        if "resource_tracker" in cmdline or own_session:
            continue
        if "forkserver" not in cmdline:
            family.append(child)
        for proc in family:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    pids.add(proc.pid)
            except psutil.NoSuchProcess:
                pass
    return pids


def loader_threads() -> set[threading.Thread]:
    """Threads alive now other than the main thread."""
    return {t for t in threading.enumerate() if t is not threading.main_thread()}


#: Threads of a loader's event loop (its thread, and the loop's default executor's), which the
#: loader's ``for`` epochs share and which live until the loader closes.
LOOP_THREADS = ("asyncloader-loop", "uvloop_", "asyncio_")


def epoch_threads() -> set[threading.Thread]:
    """Threads alive now other than the main thread and a loader's event-loop threads."""
    return {t for t in loader_threads() if not t.name.startswith(LOOP_THREADS)}


class CodedError(Exception):
    """An exception whose constructor takes an extra required argument (pickling breaks it)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class FailingSource(SyncSource):
    """Raises CodedError for index ``bad``, from a line the tests look for in tracebacks."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, index: int) -> np.ndarray:
        if index == self.bad:
            raise CodedError(f"cannot read {index}", code=7)  # FailingSource raises here
        return sample(index)


def fail_on_five(x: np.ndarray) -> np.ndarray:
    if int(x[0]) == 5:
        raise ValueError("transform rejects 5")
    return x


def failing_collate(samples: list) -> Any:
    raise RuntimeError("collate gives up")


#: Releases every StuckSource sample still blocked in this process.
RELEASE_STUCK = threading.Event()
#: Set when a StuckSource sample starts blocking in this process.
STUCK_REACHED = threading.Event()


class StuckSource(SyncSource):
    """A sync source whose sample ``stuck`` blocks its thread for ``hold_s`` seconds, or, in
    this process, until RELEASE_STUCK is set (a worker process only has the time bound)."""

    def __init__(self, n: int, stuck: int, hold_s: float = 30.0) -> None:
        super().__init__(n)
        self.stuck, self.hold_s = stuck, hold_s

    def __getitem__(self, index: int) -> np.ndarray:
        if index == self.stuck:
            STUCK_REACHED.set()
            RELEASE_STUCK.wait(self.hold_s)
        return sample(index)


class Hang:
    """An async source whose sample ``stuck`` never arrives (until cancelled)."""

    def __init__(self, n: int, stuck: int) -> None:
        self.n, self.stuck = n, stuck

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        if index == self.stuck:
            await asyncio.Event().wait()
        return sample(index)


class RandomAugment:
    """A transform drawing from all three global RNGs, as augmentations do."""

    def __call__(self, x: np.ndarray) -> dict:
        return {
            "x": torch.as_tensor(x),
            "torch": torch.rand(2),
            "py": torch.tensor([random.random()]),
            "np": torch.as_tensor(np.random.rand(2)),
        }


class NoisySource(SyncSource):
    """A sync source whose __getitem__ itself draws random numbers."""

    def __getitem__(self, index: int) -> np.ndarray:
        return sample(index) + np.random.randint(0, 1000, size=3)


class DieAt:
    """A transform that kills its worker once (marked by a file), at sample ``index``."""

    def __init__(self, index: int, how: str, marker: str) -> None:
        self.index, self.how, self.marker = index, how, marker

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if int(x[0]) == self.index and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            if self.how == "sigkill":
                os.kill(os.getpid(), 9)
            os._exit(3)
        return x


class StatefulStream:
    """An iterable source that reports and restores its position (the Stateful protocol)."""

    def __init__(self, n: int = 100) -> None:
        self.n = n
        self.pos = 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            yield sample(self.pos - 1)


class PlainStream:
    """An iterable source without state: resuming must replay and skip."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self):
        return (sample(i) for i in range(self.n))


def make_shard(samples: Iterable[tuple[str, dict[str, bytes]]]) -> bytes:
    """A WebDataset-style tar: for each (key, {ext: bytes}) a member ``key.ext`` per field."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def shard_set(n_shards: int, per_shard: int | list[int]) -> dict[str, bytes]:
    """Shards ``shard-00000.tar``...; sample ``s{shard}-{i}`` holds its own key as ``txt``."""
    counts = per_shard if isinstance(per_shard, list) else [per_shard] * n_shards
    shards = {}
    for s, count in enumerate(counts):
        keys = [f"s{s:03d}-{i:04d}" for i in range(count)]
        shards[f"shard-{s:05d}.tar"] = make_shard(
            (k, {"txt": k.encode(), "bin": bytes(1000 + len(k))}) for k in keys
        )
    return shards


class InFlight:
    """An async map-style source whose samples say how many fetches were in flight in their
    process as each began: ``(index, pid, in flight)``.

    The first fetches in each process hold until ``gather`` of them are in flight at once
    (an event, not a delay), so a process that allows ``gather`` reaches it; one that never
    does releases them after ``patience_s``, and its samples show how many it allowed.
    """

    # per process and loop (a worker's): an event belongs to the loop that first waits on it
    running = 0
    loop: asyncio.AbstractEventLoop | None = None
    gathered = asyncio.Event()

    def __init__(self, n: int, gather: int, patience_s: float = 10.0) -> None:
        self.n, self.gather, self.patience_s = n, gather, patience_s

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> tuple[int, int, int]:
        if InFlight.loop is not asyncio.get_running_loop():
            InFlight.loop, InFlight.gathered = asyncio.get_running_loop(), asyncio.Event()
        InFlight.running += 1
        try:
            now = InFlight.running
            if now >= self.gather:
                InFlight.gathered.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(InFlight.gathered.wait(), self.patience_s)
            InFlight.gathered.set()  # after a timeout too: the rest never waits
            return index, os.getpid(), now
        finally:
            InFlight.running -= 1


class UnevenStream(IterableDataset):
    """A torch IterableDataset sharded by ``get_worker_info()`` unevenly: worker ``w`` of ``k``
    yields ``sizes[w]`` samples ``(w, i)`` (a single process yields every part in turn)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        parts = [info.id] if info is not None else range(len(self.sizes))
        return ((w, i) for w in parts for i in range(self.sizes[w]))


class RaisingStream(IterableDataset):
    """Yields 0, 1, 2 in each worker, then raises CodedError(code=7) in its ``__next__``."""

    def __iter__(self):
        yield from range(3)
        raise CodedError("the stream broke", code=7)


class EpochCounting(IterableDataset):
    """Worker ``w`` of ``k`` yields ``(i, epoch)`` for its ``i % k == w`` of ``range(n)``, then
    counts an epoch; ``state_dict()`` holds the count (the dataset's own state)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from ((i, self.epoch) for i in range(first, self.n, step))
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


class CountingIterator:
    """An iterator of ``0 .. n-1`` that reports and restores its position (Stateful)."""

    def __init__(self, n: int) -> None:
        self.n, self.pos = n, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.pos >= self.n:
            raise StopIteration
        self.pos += 1
        return self.pos - 1

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]
