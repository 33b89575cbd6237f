"""The http workload's server: 127.0.0.1, 20 ms added to every request, 64 KiB bodies.

``GET /<index>`` answers, after ``LATENCY_S``, with sample ``index`` of
:mod:`benchmarks.checks` (HTTP/1.1, keep-alive, Content-Length). One asyncio process (uvloop
when installed), started by the benchmark for the whole run and stopped at its end; it prints
``port <n>`` on its first line once it listens. It serves loopback only and exits when its
parent's pipe on stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
from typing import Any

from benchmarks.checks import make_sample
from benchmarks.workloads import HTTP_SHAPE, LATENCY_S

_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
    f"Content-Length: {HTTP_SHAPE[0]}\r\n\r\n"
).encode()
_BAD = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class _Http(asyncio.Protocol):
    """One connection: parses request heads, answers each ``LATENCY_S`` later, in order."""

    def __init__(self) -> None:
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
            self._loop.call_later(LATENCY_S, self._answer, path)

    def _answer(self, path: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            index = int(path[1:])
        except ValueError:
            transport.write(_BAD)
            return
        transport.write(_HEAD + make_sample(index, HTTP_SHAPE).tobytes())

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve() -> None:
    """Listens on 127.0.0.1 (a free port), prints it, serves until stdin closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # EOF: the benchmark is done
    server.close()


def main() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve())


if __name__ == "__main__":
    main()
