"""HTTPSource: item ``i`` is the body of ``urls[i]``, fetched with aiohttp on the loader's loop.

One ``aiohttp.ClientSession`` per event loop (see :mod:`._perloop`). Its connector has no cap
of its own unless ``max_connections`` is given (aiohttp's default of 100 would silently limit
an ``io_concurrency`` above 100): the loader's ``io_concurrency`` is the bound.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader.sources._map import (
    DEFAULT_MAX_OBJECT_SIZE,
    RemoteMap,
    check_common,
    check_timeout,
    parse_items,
)
from asyncloader.sources._perloop import PerLoop
from asyncloader.sources._redact import Redactor, looks_secret, redact_url
from asyncloader.sources._retry import Permanent, Retry, Transient, check_size

if TYPE_CHECKING:
    import aiohttp

_CHUNK = 1 << 16
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def import_aiohttp() -> Any:
    """aiohttp, or an ImportError that says how to install it."""
    try:
        import aiohttp
    except ImportError as exc:
        raise ImportError("HTTP sources need aiohttp: pip install 'asyncloader[remote]'") from exc
    return aiohttp


class HTTPStatusError(Exception):
    """A response whose status is not the one asked for; retried on 5xx, 408 and 429."""

    def __init__(self, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.retry_after = retry_after


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After", "")
    return float(value) if value.isdigit() else None


class HTTPClient:
    """Reads URLs with one aiohttp session per loop (the :class:`Client` of HTTP sources).

    Args:
        timeout: Seconds for one whole-object request; for streams, seconds without data.
        headers: Sent with every request (values never shown).
        max_connections: Cap on open connections per loop; None: no cap of aiohttp's own.
        max_object_size: Largest body accepted, in bytes; None: no limit.
    """

    def __init__(
        self,
        *,
        timeout: float,
        headers: Mapping[str, str] | None,
        max_connections: int | None,
        max_object_size: int | None,
    ) -> None:
        import_aiohttp()
        check_timeout(timeout)
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"{max_connections=} must be >= 1")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.max_connections = max_connections
        self.max_object_size = max_object_size
        self.redact = Redactor(v for k, v in self.headers.items() if looks_secret(k))
        self._sessions: PerLoop[aiohttp.ClientSession] = PerLoop(self._open, self._shut)

    async def _open(self) -> aiohttp.ClientSession:
        aiohttp = import_aiohttp()
        connector = aiohttp.TCPConnector(limit=self.max_connections or 0, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=self.timeout
        )
        return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers)

    @staticmethod
    async def _shut(session: aiohttp.ClientSession) -> None:
        await session.close()

    def shown(self, target: str) -> str:
        return redact_url(target)

    @staticmethod
    def _check(resp: aiohttp.ClientResponse, start: int, ranged: bool) -> int:
        """Checks the status; returns how many leading bytes to drop (a Range ignored)."""
        if resp.status == 206 and ranged:
            match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
            if match is None or int(match[1]) != start:
                raise Transient(f"Content-Range {resp.headers.get('Content-Range')!r} != {start}-")
            return 0
        if resp.status == 200:
            return start  # no range asked, or the server ignored it: skip the head ourselves
        raise HTTPStatusError(resp.status, resp.reason or "", _retry_after(resp.headers))

    def _request_headers(self, start: int, length: int | None, pin: dict[str, Any]) -> dict:
        headers = {}
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            headers["Range"] = f"bytes={start}-{end}"
        if start and "etag" in pin:
            headers["If-Match"] = pin["etag"]
        return headers

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        session = await self._sessions.get()
        first = start or 0
        async with (
            asyncio.timeout(self.timeout),
            session.get(target, headers=self._request_headers(first, length, {})) as resp,
        ):
            drop = self._check(resp, first, start is not None)
            declared = resp.content_length
            body: bytes | bytearray
            if declared is not None:
                # Size known and checked: one read into one buffer (the common, fast path).
                check_size(declared - drop, self.max_object_size, lambda: self.shown(target))
                body = await resp.read()
            else:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    body += chunk
                    if self.max_object_size is not None and len(body) - drop > self.max_object_size:
                        check_size(
                            len(body) - drop, self.max_object_size, lambda: self.shown(target)
                        )
            if declared is not None and len(body) != declared and _identity(resp):
                raise Transient(f"truncated body: {len(body)} of {declared} bytes")
        if drop == 0 and length is None:
            data = bytes(body)  # no copy when aiohttp already returned bytes
        else:
            data = bytes(memoryview(body)[drop : None if length is None else drop + length])
        if length is not None and len(data) != length:
            raise Permanent(f"range {first}+{length} goes past the end ({first + len(data)})")
        return data

    async def stream(
        self, target: str, start: int, pin: dict[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        session = await self._sessions.get()
        async with session.get(target, headers=self._request_headers(start, None, pin)) as resp:
            drop = self._check(resp, start, start > 0)
            if "ETag" in resp.headers:
                pin.setdefault("etag", resp.headers["ETag"])
            declared, got = resp.content_length, 0
            async for chunk in resp.content.iter_chunked(_CHUNK):
                got += len(chunk)
                if drop:
                    cut = min(drop, len(chunk))
                    chunk, drop = chunk[cut:], drop - cut
                if chunk:
                    yield chunk
            if declared is not None and got != declared and _identity(resp):
                raise Transient(f"truncated body: {got} of {declared} bytes")

    async def aclose(self) -> None:
        await self._sessions.aclose()

    def __repr__(self) -> str:
        headers = f", headers=<{len(self.headers)}>" if self.headers else ""
        return f"HTTPClient(timeout={self.timeout}{headers})"


def _identity(resp: aiohttp.ClientResponse) -> bool:
    """Content-Length counts the bytes we read (no Content-Encoding decoded them)."""
    return resp.headers.get("Content-Encoding", "identity") == "identity"


class HTTPSource(RemoteMap):
    """An async map-style source: item ``i`` is the body of ``urls[i]`` (or ``decode(body)``).

    Args:
        urls: URLs, or ``(url, offset, length)`` tuples for Range reads.
        timeout: Seconds for one request (connect, headers and body) before it is retried.
        headers: Sent with every request; values of credential-like names (Authorization,
            X-Api-Key...) never appear in reprs, logs or errors.
        retry: Retries with exponential backoff and jitter on 5xx, 429, resets, timeouts and
            truncated bodies; other 4xx fail at once.
        decode: ``fn(bytes) -> sample``, run on the event loop (keep it cheap; heavy decoding
            belongs in the loader's ``transform``).
        on_error: ``"raise"`` (default): a failed item raises FetchError. ``"skip"``: it
            becomes a :class:`Skipped` marker (see :func:`drop_skipped`) and is counted in
            ``skipped``, up to ``max_skipped``.
        max_skipped: The most items to skip with ``on_error="skip"``.
        max_object_size: Largest body accepted, in bytes (default 256 MiB); None: no limit.
        max_connections: Cap on open connections per event loop; default none beyond the
            loader's ``io_concurrency``.

    The aiohttp session is created on the event loop the source is first awaited on, one per
    loop, and closed when that loop shuts down (or by :meth:`aclose`). The source pickles
    without it.
    """

    def __init__(
        self,
        urls: Sequence[str | tuple[str, int, int]],
        /,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        retry: Retry | None = None,
        decode: Callable[[bytes], Any] | None = None,
        on_error: str = "raise",
        max_skipped: int | None = None,
        max_object_size: int | None = DEFAULT_MAX_OBJECT_SIZE,
        max_connections: int | None = None,
    ) -> None:
        retry = retry or Retry()
        check_common(retry, max_object_size, decode)
        items = parse_items(urls, "urls")
        for target, _, _ in items:
            if not target.startswith(("http://", "https://")):
                raise ValueError(f"{redact_url(target)!r} is not an http:// or https:// URL")
        client = HTTPClient(
            timeout=timeout,
            headers=headers,
            max_connections=max_connections,
            max_object_size=max_object_size,
        )
        super().__init__(
            items, client, decode=decode, retry=retry, on_error=on_error, max_skipped=max_skipped
        )
