"""A local HTTP file server with a fixed latency per request and byte ranges: what the
columnar probe reads Parquet and JSON Lines files from, as from an object store.

It runs in a process of its own, bound to 127.0.0.1 on a free port, and serves the files of
one folder at ``/<name>`` (GET and HEAD; ``Range: bytes=a-b``, ``a-`` and ``-n``; a strong
ETag; Content-Length), ``latency`` seconds after each request arrived. ``GET /__stats`` returns
``{"requests", "bytes"}``: requests answered and body bytes sent since the last
``/__stats?reset=1``. Use it as a context manager::

    with RangeServer(folder, latency=0.020) as server:
        urls = [server.url(name) for name in names]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import urllib.request
from pathlib import Path
from typing import Any


def _body_size(spec: str, size: int) -> int:
    """The bytes a GET with Range header ``spec`` gets of a ``size``-byte file."""
    first, dash, last = spec.removeprefix("bytes=").partition("-")
    if not dash or "," in spec:
        return size
    if not first:
        return min(int(last), size)
    end = min(int(last) + 1, size) if last else size
    return max(0, end - int(first))


def _serve(folder: str, latency: float, ready: Any, stop: Any) -> None:
    from aiohttp import web

    counts = {"requests": 0, "bytes": 0}
    root = Path(folder)

    async def stats(request: web.Request) -> web.Response:
        body = json.dumps(counts)
        if request.query.get("reset"):
            counts["requests"], counts["bytes"] = 0, 0
        return web.Response(text=body)

    async def serve_file(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(latency)
        path = root / request.match_info["name"]
        if not path.is_file():
            return web.Response(status=404)
        counts["requests"] += 1
        if request.method == "GET":
            counts["bytes"] += _body_size(request.headers.get("Range", ""), path.stat().st_size)
        return web.FileResponse(path)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/__stats", stats)
        app.router.add_route("*", "/{name}", serve_file)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.get_running_loop().run_in_executor(None, stop.recv_bytes)
        await runner.cleanup()

    asyncio.run(main())


class RangeServer:
    """Serves ``folder`` over HTTP with ``latency`` seconds per request (see the module)."""

    def __init__(self, folder: str | Path, latency: float) -> None:
        self.folder, self.latency = str(folder), latency
        self.port = 0
        self._process: multiprocessing.Process | None = None
        self._stop: Any = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stats(self, reset: bool = False) -> dict[str, int]:
        query = "?reset=1" if reset else ""
        with urllib.request.urlopen(self.url("__stats") + query) as reply:
            counts: dict[str, int] = json.loads(reply.read())
        return counts

    def __enter__(self) -> RangeServer:
        context = multiprocessing.get_context("spawn")
        ready_here, ready_there = context.Pipe(duplex=False)
        stop_there, self._stop = context.Pipe(duplex=False)
        args = (self.folder, self.latency, ready_there, stop_there)
        self._process = context.Process(target=_serve, args=args, daemon=True)
        self._process.start()
        self.port = ready_here.recv()
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(OSError):
            self._stop.send_bytes(b"stop")
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
