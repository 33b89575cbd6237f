"""A TCP proxy in a process of its own that adds ``latency`` seconds to every request relayed to
an upstream server on 127.0.0.1: the S3 benchmarks' way to make a local SeaweedFS look remote.

Each client connection gets its own upstream connection; every chunk of bytes the client sends
is written upstream ``latency`` seconds after it arrived (in order), and the upstream's answers
are relayed back at once. An HTTP/1.1 client sends a request and waits for its answer, so each
request (GET, HEAD, LIST alike) reaches the server ``latency`` later, whatever its size, and
requests on different connections wait side by side. No HTTP parsing, one asyncio protocol pair
per connection on uvloop when installed: the proxy takes as little as it can of the cores it
shares with the loaders. It counts requests (lines ending ``HTTP/1.1``, for the report) and
connections.

Use it as a context manager; it stops when the ``with`` block ends, or when this process exits
(its end of the pipe to the proxy closes)::

    with LatencyProxy(upstream_port, latency=0.1) as proxy:
        endpoint = proxy.endpoint  # http://127.0.0.1:<port>
        proxy.stats()  # {"requests": ..., "connections": ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
from typing import Any

from examples.latency_server import ServerProcess, run_on_uvloop


class _Counts:
    requests = 0
    connections = 0


class _Upstream(asyncio.Protocol):
    """The proxy's connection to the server: relays its bytes to the client at once."""

    def __init__(self, downstream: _Downstream) -> None:
        self._down = downstream

    def connection_made(self, transport: Any) -> None:
        self._down.upstream_ready(transport)

    def data_received(self, data: bytes) -> None:
        self._down.send(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._down.close()


class _Downstream(asyncio.Protocol):
    """A client's connection: each chunk is written upstream ``latency`` after it arrived."""

    def __init__(self, upstream_port: int, latency: float, counts: _Counts) -> None:
        self._port = upstream_port
        self._latency = latency
        self._counts = counts
        self._loop = asyncio.get_running_loop()
        self._transport: Any = None
        self._up: Any = None
        self._early: list[bytes] = []  # arrived before the upstream connection was made

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._counts.connections += 1
        self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            await self._loop.create_connection(lambda: _Upstream(self), "127.0.0.1", self._port)
        except OSError:
            self.close()

    def upstream_ready(self, transport: Any) -> None:
        self._up = transport
        for data in self._early:
            transport.write(data)
        self._early.clear()
        if self._transport is None:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self._counts.requests += data.count(b" HTTP/1.1\r\n")
        self._loop.call_later(self._latency, self._relay, data)

    def _relay(self, data: bytes) -> None:
        if self._up is None:
            self._early.append(data)
        elif not self._up.is_closing():
            self._up.write(data)

    def send(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)  # pause_writing() pauses the upstream when the client lags

    def pause_writing(self) -> None:
        if self._up is not None:
            self._up.pause_reading()

    def resume_writing(self) -> None:
        if self._up is not None:
            self._up.resume_reading()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if self._up is not None and not self._up.is_closing():
            self._up.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        # The client is gone: close upstream once the bytes already scheduled have gone out.
        self._loop.call_later(self._latency, self.close)


def _serve(upstream_port: int, latency: float, conn: Any) -> None:
    """The proxy process: listens, sends its port on ``conn``, answers ``"stats"`` requests,
    and stops when ``conn`` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = _Counts()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Downstream(upstream_port, latency, counts), "127.0.0.1", 0, backlog=4096
        )
        conn.send(server.sockets[0].getsockname()[1])
        with contextlib.suppress(EOFError, OSError):
            while True:
                await loop.run_in_executor(None, conn.recv)  # EOF: the parent is done
                conn.send({"requests": counts.requests, "connections": counts.connections})
        server.close()

    run_on_uvloop(main)


class LatencyProxy(ServerProcess):
    """Relays ``http://127.0.0.1:<port>`` to ``127.0.0.1:upstream_port``, ``latency`` seconds
    later per request (see the module's docstring)."""

    def __init__(self, upstream_port: int, latency: float) -> None:
        self._upstream_port = upstream_port
        self._latency = latency

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        """Requests and connections relayed so far."""
        self._conn.send("stats")
        return self._conn.recv()

    def __enter__(self) -> LatencyProxy:
        self._start(_serve, (self._upstream_port, self._latency), "latency proxy", daemon=True)
        return self
