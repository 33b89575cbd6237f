"""The benchmark workloads of DESIGN.md, as datasets every loader can read, and the http
workload's server.

Each workload has a blocking flavour (DataLoader, torchdata.nodes threads or processes) and,
where the work is waiting, an ``async`` flavour (asyncloader, SPDL's async stage); both give
identical samples (see :mod:`benchmarks.checks`). Everything here is picklable and defined at
module level, so worker processes started by any method can import it. The http workload's
server (:func:`http_server`) is ``examples/latency_server.py``, the repository's one latency
server (the demo's too), serving :class:`HttpBodies`.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.checks import make_sample
from examples.latency_server import LatencyServer

LATENCY_S = 0.020
IO_SHAPE = (1024,)
HTTP_SHAPE = (64 * 1024,)
CPU_SHAPE = (1024,)
BIG_SHAPE = (3, 224, 224)
BURN_STEPS = 18_000  # ~1.5 ms of pure Python (GIL held) on the 2-core reference machine


@dataclass(frozen=True)
class Workload:
    """One row of DESIGN.md's workload table."""

    name: str
    items: int
    batch: int
    shape: tuple[int, ...]
    latency_bound: bool  # io/http: swept over io_concurrency; the rest use 2 workers


WORKLOADS = {
    "io": Workload("io", 2000, 32, IO_SHAPE, True),
    "http": Workload("http", 2000, 32, HTTP_SHAPE, True),
    "cpu": Workload("cpu", 2000, 32, CPU_SHAPE, False),
    "big": Workload("big", 1280, 64, BIG_SHAPE, False),
    "overhead": Workload("overhead", 40000, 64, (), False),
}


class Samples:
    """``n`` samples, indices ``0..n-1``; subclasses define ``__getitem__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class SleepSource(Samples):
    """io, blocking: each sample arrives after ``time.sleep(LATENCY_S)``."""

    def __getitem__(self, index: int) -> np.ndarray:
        time.sleep(LATENCY_S)
        return make_sample(index, IO_SHAPE)


class AsyncSleepSource(Samples):
    """io, async: each sample arrives after ``await asyncio.sleep(LATENCY_S)``."""

    async def __getitem__(self, index: int) -> np.ndarray:
        await asyncio.sleep(LATENCY_S)
        return make_sample(index, IO_SHAPE)


_local = threading.local()


def _connection(port: int) -> http.client.HTTPConnection:
    """This thread's keep-alive connection (made lazily, so it is never pickled or forked)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    return conn


class HttpBodies(Samples):
    """What the http workload's server sends: ``GET /<index>`` gets sample ``index``'s bytes."""

    def __getitem__(self, index: int) -> bytes:
        return make_sample(index, HTTP_SHAPE).tobytes()


def http_server(n: int, latency: float = LATENCY_S) -> LatencyServer:
    """The http workload's server, not yet started: samples ``0..n-1``, ``latency`` each.

    Its own process, for the whole benchmark; ``with http_server(n) as server:`` starts it and
    ``server.port`` is what the http sources below connect to.
    """
    return LatencyServer(HttpBodies(n), latency=latency)


class HttpSource(Samples):
    """http, blocking: ``GET /<index>`` with http.client, one keep-alive connection a thread."""

    def __init__(self, n: int, port: int) -> None:
        super().__init__(n)
        self.port = port

    def __getitem__(self, index: int) -> np.ndarray:
        conn = _connection(self.port)
        conn.request("GET", f"/{index}")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /{index}: HTTP {response.status}")
        return np.frombuffer(body, dtype=np.uint8)


class AsyncHttpSource(Samples):
    """http, async: ``GET /<index>`` over asyncio streams, reusing idle keep-alive connections.

    A minimal HTTP/1.1 client (the server always sends Content-Length), so that the async and
    the blocking loaders both use the standard library and differ only in how they wait.
    """

    def __init__(self, n: int, port: int) -> None:
        super().__init__(n)
        self.port = port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def __getstate__(self) -> dict:
        return {"n": self.n, "port": self.port, "_idle": []}

    async def __getitem__(self, index: int) -> np.ndarray:
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        writer.write(f"GET /{index} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"GET /{index}: HTTP {status.decode()}")
        self._idle.append((reader, writer))
        return np.frombuffer(body, dtype=np.uint8)

    def close(self) -> None:
        """Closes the idle connections (call on the loop that made them, or after it stopped)."""
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def burn(sample: np.ndarray) -> np.ndarray:
    """The cpu workload's transform: ~1.5 ms of pure-Python work, GIL held; sample unchanged."""
    x = 0
    for i in range(BURN_STEPS):
        x = (x * 31 + i) % 1000003
    return sample


class MemorySource:
    """cpu: samples already in memory (made once, before the clock starts)."""

    def __init__(self, n: int) -> None:
        self.data = [make_sample(i, CPU_SHAPE) for i in range(n)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.data[index]


class BurnedSource(MemorySource):
    """cpu for loaders without a transform argument: ``burn`` inside ``__getitem__``."""

    def __getitem__(self, index: int) -> np.ndarray:
        return burn(self.data[index])


class BigSource(Samples):
    """big: a 3x224x224 sample (or one of ``shape``) made where ``__getitem__`` runs (in the
    worker)."""

    def __init__(self, n: int, shape: tuple[int, ...] = BIG_SHAPE) -> None:
        super().__init__(n)
        self.shape = shape

    def __getitem__(self, index: int) -> np.ndarray:
        return make_sample(index, self.shape)


class IndexSource(Samples):
    """overhead: ``__getitem__`` returns the index: what is left is the loader's own cost."""

    def __getitem__(self, index: int) -> int:
        return index
