"""A local HTTP server that adds a fixed latency to every request, for the demo and benchmarks.

It runs in a process of its own (its own interpreter and GIL, as a real server would be),
bound to 127.0.0.1 on a free port, and serves ``GET /<i>`` with body ``i`` of a list given at
start, or of ``n`` synthetic bodies of ``size`` bytes. Use it as a context manager::

    with LatencyServer(bodies, latency=0.020) as server:
        urls = server.urls()
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Sequence
from typing import Any


def _serve(bodies: Sequence[bytes] | tuple[int, int], latency: float, conn: Any) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(latency)
        try:
            i = int(request.match_info["i"])
        except ValueError:
            return web.Response(status=404)
        if isinstance(bodies, tuple):
            n, size = bodies
            return (
                web.Response(body=bytes([i % 256]) * size)
                if 0 <= i < n
                else web.Response(status=404)
            )
        if not 0 <= i < len(bodies):
            return web.Response(status=404)
        return web.Response(body=bodies[i])

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{i}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.Event().wait()  # until the parent terminates this process

    asyncio.run(main())


class LatencyServer:
    """Serves ``bodies`` (a list of bytes, or ``(n, size)`` synthetic ones) with ``latency``.

    Args:
        bodies: What ``GET /<i>`` returns.
        latency: Seconds added before every response.
    """

    def __init__(self, bodies: Sequence[bytes] | tuple[int, int], latency: float = 0.020) -> None:
        self._bodies = bodies if isinstance(bodies, tuple) else list(bodies)
        self._n = bodies[0] if isinstance(bodies, tuple) else len(bodies)
        self._latency = latency
        self._proc: Any = None
        self.port = 0

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.port}/{i}" for i in range(self._n)]

    def __enter__(self) -> LatencyServer:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(self._bodies, self._latency, child), name="latency-server"
        )
        self._proc.start()
        if not parent.poll(60):
            self._proc.terminate()
            raise RuntimeError("the latency server did not start")
        self.port = parent.recv()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._proc.terminate()
        self._proc.join()
