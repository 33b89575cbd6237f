"""A local HTTP server that adds a fixed latency to every request: the demo's and the benchmarks'.

It runs in a process of its own (its own interpreter and GIL, as a real server would be),
bound to 127.0.0.1 on a free port, and answers ``GET /<i>``, ``latency`` seconds after the
request arrived, with ``bodies[i]`` (HTTP/1.1, keep-alive, Content-Length; 404 for an index
``bodies`` does not have). ``bodies`` is any picklable :class:`Bodies`: a list of bytes, or
an object that makes body ``i`` when asked (the benchmark's
:class:`benchmarks.workloads.HttpBodies`). One asyncio protocol on uvloop when installed and
no HTTP framework, so that the server takes as little as it can of the cores it shares with
the client. Use it as a context manager::

    with LatencyServer(bodies, latency=0.020) as server:
        urls = server.urls()

The server stops when the ``with`` block ends, or when this process exits (its end of the pipe
to the server closes). ``examples/http_demo.py`` imports this module as ``latency_server``;
the benchmarks, run from the repository root, as ``examples.latency_server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
from typing import Any, Protocol


class Bodies(Protocol):
    """What the server serves: ``len`` bodies, body ``i`` as bytes (a list of bytes is one)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> bytes: ...


_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"


class _Http(asyncio.Protocol):
    """One connection: parses request heads, answers each ``latency`` later, in order."""

    def __init__(self, bodies: Bodies, latency: float) -> None:
        self._bodies = bodies
        self._latency = latency
        self._buf = b""
        self._transport: Any = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # uvloop's transports are not asyncio.Transport instances

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while b"\r\n\r\n" in self._buf:
            head, self._buf = self._buf.split(b"\r\n\r\n", 1)
            path = head.split(b" ", 2)[1]
            self._loop.call_later(self._latency, self._answer, path)

    def _answer(self, path: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            index = int(path[1:])
        except ValueError:
            index = -1
        if not 0 <= index < len(self._bodies):
            transport.write(_NOT_FOUND)
            return
        body = self._bodies[index]
        transport.write(_HEAD % len(body) + body)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


def _serve(bodies: Bodies, latency: float, conn: Any) -> None:
    """The server process: listens, sends its port on ``conn``, serves until ``conn`` closes."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per request

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Http(bodies, latency), "127.0.0.1", 0, backlog=4096
        )
        conn.send(server.sockets[0].getsockname()[1])
        with contextlib.suppress(EOFError):
            await loop.run_in_executor(None, conn.recv)  # EOF: the parent is done
        server.close()

    run_on_uvloop(main)


def run_on_uvloop(main: Any) -> None:
    """Runs ``main()`` to completion on uvloop when installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


class ServerProcess:
    """A server in a spawned process of its own, which sends its port over a pipe (the pipe's
    child end is its target's last argument) and stops when the pipe closes: on ``__exit__``,
    or when this process exits. Subclasses call :meth:`_start` in ``__enter__``."""

    _proc: Any = None
    _conn: Any = None
    port = 0

    def _start(self, target: Any, args: tuple, name: str, daemon: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(*args, child), name=name, daemon=daemon)
        self._proc.start()
        child.close()
        try:
            self.port = self._conn.recv() if self._conn.poll(60) else 0
        except EOFError:
            self.port = 0
        if not self.port:
            self.__exit__()
            raise RuntimeError(f"the {name} did not start (exit {self._proc.exitcode})")

    def __exit__(self, *exc_info: object) -> None:
        self._conn.close()
        self._proc.join(10)
        if self._proc.exitcode is None:
            self._proc.terminate()
            self._proc.join(10)
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()


class LatencyServer(ServerProcess):
    """Serves ``GET /<i>`` with ``bodies[i]``, ``latency`` seconds after each request.

    Args:
        bodies: What ``GET /<i>`` returns (picklable: it is sent to the server's process).
        latency: Seconds added before every response.
    """

    def __init__(self, bodies: Bodies, latency: float = 0.020) -> None:
        self._bodies = bodies
        self._latency = latency

    def urls(self) -> list[str]:
        """The URL of every body, in order."""
        return [f"http://127.0.0.1:{self.port}/{i}" for i in range(len(self._bodies))]

    def __enter__(self) -> LatencyServer:
        self._start(_serve, (self._bodies, self._latency), "latency server")
        return self
