"""HTTPSource: item ``i`` is the body of ``urls[i]``, fetched with aiohttp on the loader's loop.

One ``aiohttp.ClientSession`` per event loop (see :mod:`._perloop`). Its connector has no cap
of its own unless ``max_connections`` is given (aiohttp's default of 100 would silently limit
an ``io_concurrency`` above 100): the loader's ``io_concurrency`` is the bound.

What a reply must show before its bytes are used:

- Redirects are followed here (at most ``MAX_REDIRECTS``), not by aiohttp: headers treated as
  secret (credential-like names, and Cookie) go only to the first URL's origin (scheme, host,
  port), and a redirect from https to http is refused when the request carries any.
- ``max_object_size`` counts decoded bytes (a gzipped reply is counted as it inflates).
- A whole object's body must be framed: a Content-Length, or chunks ending with the last one.
  A close-delimited body (neither) is refused: a cut connection would pass for its end.
- A stream's request gets ``timeout`` seconds plus ``timeout`` more per ``PACE`` bytes it
  delivers (time spent waiting on the server only): a trickle is cut (TimeoutError, retried).
- A resumed stream must be the same object: the first reply's ETag (sent as If-Match when
  strong), Last-Modified and size are compared with each later reply's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader.sources._map import (
    DEFAULT_MAX_OBJECT_SIZE,
    RemoteMap,
    check_common,
    check_timeout,
    parse_items,
)
from asyncloader.sources._perloop import PerLoop
from asyncloader.sources._redact import (
    Redactor,
    header_secrets,
    looks_secret,
    redact_url,
    url_secrets,
)
from asyncloader.sources._retry import Permanent, Retry, Transient, check_size, is_transient

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

    from asyncloader.sources._cache.disk_cache import DiskCache

_CHUNK = 1 << 16
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
#: A stream's request may take ``timeout`` seconds, plus ``timeout`` per PACE bytes delivered.
PACE = 1 << 16
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DELAY_SECONDS = re.compile(r"[0-9]{1,9}")  # RFC 9110 delay-seconds (ASCII digits), bounded
_MAX_RETRY_AFTER = 86400.0


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


def parse_retry_after(value: str, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait, per RFC 9110: delay-seconds or an
    HTTP-date (past dates: 0), at most a day; None for anything else (the backoff applies).

    Args:
        value: The header's value.
        now: The current time as a Unix timestamp (``time.time()``).
    """
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value) if _DELAY_SECONDS.fullmatch(value) else _MAX_RETRY_AFTER
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # TypeError: None on 3.11
        return None
    if when.tzinfo is None:  # "-0000": UTC, as an HTTP-date always is
        when = when.replace(tzinfo=datetime.UTC)
    wait = when.timestamp() - (time.time() if now is None else now)
    return min(max(wait, 0.0), _MAX_RETRY_AFTER)


def _secret_header(name: str, value: str) -> bool:
    """Whether a header holds a credential (so goes to the first URL's origin only): a
    credential-like name or Cookie, or a URL with a password or query values."""
    if looks_secret(name) or name.lower() == "cookie":
        return True
    return "://" in value and bool(url_secrets(value))


def next_hop(url: str | URL, location: str, first: str | URL, secrets: bool) -> tuple[URL, bool]:
    """Where a redirect from ``url`` to ``location`` leads, and whether that is on the origin
    (scheme, host, port) of ``first``, the URL asked for.

    Raises:
        Permanent: The target is not http(s), or goes from https to http while ``secrets``
            (credentials) are sent with the request.
    """
    from yarl import URL  # aiohttp's own dependency

    base = URL(str(url))
    hop = base.join(URL(location)).with_fragment(None)
    shown = redact_url(str(hop))
    if hop.scheme not in ("http", "https") or not hop.host:
        raise Permanent(f"a redirect to {shown!r}, not an http(s) URL")
    if secrets and base.scheme == "https" and hop.scheme == "http":
        raise Permanent(
            f"a redirect from https:// to http:// refused: the request carries credentials "
            f"({shown!r})"
        )
    origin = URL(str(first))
    return hop, (hop.scheme, hop.host, hop.port) == (origin.scheme, origin.host, origin.port)


def _validators(resp: aiohttp.ClientResponse) -> dict[str, str]:
    """What identifies the object's version in a reply: ETag, Last-Modified, total size."""
    found = {name: resp.headers.get(name) for name in ("ETag", "Last-Modified")}
    match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
    if resp.status == 206 and match is not None and match[3] != "*":
        found["size"] = match[3]
    elif resp.status == 200 and resp.content_length is not None and _identity(resp):
        found["size"] = str(resp.content_length)
    return {name: value for name, value in found.items() if value is not None}


def _same_object(
    resp: aiohttp.ClientResponse, start: int, pin: dict[str, Any], *, repin: bool = True
) -> None:
    """Pins the validators of a stream's first reply (and, with ``repin``, of any reply from
    byte 0: nothing of the object was used yet); a reply from later on must show the same
    strong ETag, or without one, the same validators (ETag, Last-Modified, size) as were
    pinned.

    Raises:
        Permanent: The object changed (or no longer shows a validator it showed).
    """
    seen = _validators(resp)
    if (repin and start == 0) or "validators" not in pin:
        pin["validators"] = seen
        pin.pop("etag", None)
        if not seen.get("ETag", "W/").startswith("W/"):  # If-Match compares strongly
            pin["etag"] = seen["ETag"]
        return
    pinned = pin["validators"]
    # A strong ETag names the bytes: trusted alone (a reply cut short said a smaller size).
    names = ["ETag"] if "etag" in pin else list(pinned)
    for name in names:
        value = pinned[name]
        if seen.get(name) != value:
            raise Permanent(
                f"the object changed while it was read: its {name} was {value!r}, at byte "
                f"{start} it is {seen.get(name)!r}; the two versions are not spliced"
            )


class HTTPClient:
    """Reads URLs with one aiohttp session per loop (the :class:`Client` of HTTP sources).

    Args:
        timeout: Seconds for one whole-object request; for streams, seconds without data, and
            the pace: ``timeout`` more per ``PACE`` bytes delivered (see the module's notes).
        headers: Sent with every request (values never shown); secret ones only to the
            origin of the URL asked for.
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
        self.redact = Redactor(header_secrets(self.headers))
        self._plain = {k: v for k, v in self.headers.items() if not _secret_header(k, v)}
        self._sessions: PerLoop[aiohttp.ClientSession] = PerLoop(self._open, self._shut)

    async def _open(self) -> aiohttp.ClientSession:
        http = import_aiohttp()
        connector = http.TCPConnector(limit=self.max_connections or 0, limit_per_host=0)
        timeout = http.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout)
        # No default headers: each request carries them, less the secret ones off the origin.
        session: aiohttp.ClientSession = http.ClientSession(connector=connector, timeout=timeout)
        return session

    @staticmethod
    async def _shut(session: aiohttp.ClientSession) -> None:
        await session.close()

    def shown(self, target: str) -> str:
        return redact_url(target)

    @staticmethod
    def _check(resp: aiohttp.ClientResponse, start: int, ranged: bool, pin: dict[str, Any]) -> int:
        """Checks the status; returns how many leading bytes to drop (a Range ignored)."""
        if resp.status == 206 and ranged:
            match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
            if match is None or int(match[1]) != start:
                raise Transient(f"Content-Range {resp.headers.get('Content-Range')!r} != {start}-")
            if not _identity(resp):  # the range would be one of the encoded bytes
                raise Permanent(f"a ranged reply with Content-Encoding {_encoding(resp)!r}")
            return 0
        if resp.status == 200:
            return start  # no range asked, or the server ignored it: skip the head ourselves
        if resp.status == 412 and "etag" in pin:
            raise Permanent(
                f"the object changed while it was read: at byte {start} the server no longer "
                f"matches ETag {pin['etag']!r} (412); the two versions are not spliced"
            )
        after = parse_retry_after(resp.headers.get("Retry-After", ""))
        raise HTTPStatusError(resp.status, resp.reason or "", after)

    def _request_headers(
        self, start: int, length: int | None, pin: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Range (and, for streams, If-Match) headers; identity encoding for a range or a
        stream (``pin`` given), whose offsets are the object's bytes."""
        headers = {}
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            headers["Range"] = f"bytes={start}-{end}"
        if pin is not None or "Range" in headers:
            headers["Accept-Encoding"] = "identity"
        if start and pin and "etag" in pin:
            headers["If-Match"] = pin["etag"]
        return headers

    @contextlib.asynccontextmanager
    async def _get(
        self, session: aiohttp.ClientSession, target: str, extra: dict[str, str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The reply to GET ``target`` after at most ``MAX_REDIRECTS`` redirects, followed
        here: secret headers go to ``target``'s origin only (see :func:`next_hop`)."""
        url: str | URL = target
        keep = True
        for _ in range(MAX_REDIRECTS + 1):
            headers = {**(self.headers if keep else self._plain), **extra}
            async with session.get(url, headers=headers, allow_redirects=False) as resp:
                location = resp.headers.get("Location") if resp.status in _REDIRECTS else None
                if location is None:
                    yield resp
                    return
            url, same = next_hop(resp.url, location, target, self._carries_secrets(target))
            keep = keep and same
        raise Permanent(
            f"more than {MAX_REDIRECTS} redirects (a loop?), the last to {redact_url(str(url))!r}"
        )

    def _carries_secrets(self, target: str) -> bool:
        """Whether a request for ``target`` sends credentials: a secret header, or a password
        in the URL (aiohttp sends it as Basic auth)."""
        from yarl import URL

        return len(self._plain) < len(self.headers) or URL(target).password is not None

    async def _body(
        self, resp: aiohttp.ClientResponse, drop: int, whole: bool, target: str
    ) -> bytes | bytearray:
        """The body, its decoded size held to ``max_object_size`` as it arrives.

        Raises:
            Permanent: Over the size limit, or a whole object's body close-delimited.
            Transient: Fewer bytes than its Content-Length.
        """
        declared = resp.content_length
        if declared is not None and _identity(resp):
            # Size known and checked: one read into one buffer (the common, fast path).
            check_size(declared - drop, self.max_object_size, lambda: self.shown(target))
            body = await resp.read()
            if len(body) != declared:
                raise Transient(f"truncated body: {len(body)} of {declared} bytes")
            return body
        if whole and declared is None and not _chunked(resp):
            raise Permanent(
                "a close-delimited body (no Content-Length, not chunked): a cut connection "
                "would pass for its end, so it cannot be verified"
            )
        buffer = bytearray()
        async for chunk in resp.content.iter_chunked(_CHUNK):
            buffer += chunk
            check_size(len(buffer) - drop, self.max_object_size, lambda: self.shown(target))
        return buffer

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        session = await self._sessions.get()
        first = start or 0
        try:
            async with (
                asyncio.timeout(self.timeout),
                self._get(session, target, self._request_headers(first, length, None)) as resp,
            ):
                drop = self._check(resp, first, start is not None, {})
                body = await self._body(resp, drop, length is None, target)
        except TimeoutError as exc:
            raise TimeoutError(f"no whole reply within timeout={self.timeout}s") from exc
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
        pace = _Pace(self.timeout, start)
        async with contextlib.AsyncExitStack() as stack:
            headers = self._request_headers(start, None, pin)
            resp = await pace.wait(stack.enter_async_context(self._get(session, target, headers)))
            drop = self._check(resp, start, start > 0, pin)
            _same_object(resp, start, pin)
            declared = resp.content_length
            chunks = resp.content.iter_chunked(_CHUNK)
            while (chunk := await pace.next(chunks)) is not None:
                if drop:
                    cut = min(drop, len(chunk))
                    chunk, drop = chunk[cut:], drop - cut
                if chunk:
                    yield chunk
            if declared is not None and pace.got != declared and _identity(resp):
                raise Transient(f"truncated body: {pace.got} of {declared} bytes from byte {start}")

    async def aclose(self) -> None:
        await self._sessions.aclose()

    def __repr__(self) -> str:
        headers = f", headers=<{len(self.headers)}>" if self.headers else ""
        return f"HTTPClient(timeout={self.timeout}{headers})"


def _encoding(resp: aiohttp.ClientResponse) -> str:
    return resp.headers.get("Content-Encoding", "identity").strip().lower()


def _identity(resp: aiohttp.ClientResponse) -> bool:
    """Content-Length counts the bytes we read (no Content-Encoding decoded them)."""
    return _encoding(resp) == "identity"


def _chunked(resp: aiohttp.ClientResponse) -> bool:
    """Chunked transfer: aiohttp raises ClientPayloadError when the last chunk is missing."""
    return "chunked" in resp.headers.get("Transfer-Encoding", "").lower()


class _Pace:
    """The server time of one stream request, held to ``timeout * (1 + got / PACE)`` seconds:
    only time awaiting the server counts (not the consumer's), checked as each chunk comes, so
    a request ends within one ``timeout`` (aiohttp's wait between bytes) past its budget.

    Transport failures leave with the byte they happened at (``at``).
    """

    def __init__(self, timeout: float, start: int) -> None:
        self.timeout, self.start = timeout, start
        self.spent = 0.0
        self.got = 0

    async def wait(self, step: Any) -> Any:
        """``await step``, its time counted, bounded by the budget left."""
        began = time.monotonic()
        try:
            async with asyncio.timeout(self._left()):
                return await step
        finally:
            self.spent += time.monotonic() - began

    def _left(self) -> float:
        return self.timeout * (1 + self.got / PACE) - self.spent

    async def next(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next chunk (None at the end).

        Raises:
            TimeoutError: The request is over its budget.
            Transient: The transport failed (the byte it failed at in the message).
        """
        began = time.monotonic()
        try:
            chunk = await anext(chunks, None)
        except Exception as exc:
            if isinstance(exc, Transient | TimeoutError) or not is_transient(exc):
                raise
            raise Transient(f"{type(exc).__name__}: {exc} (at byte {self.at})") from exc
        self.spent += time.monotonic() - began
        if chunk is None:
            return None
        self.got += len(chunk)
        if self._left() < 0:
            raise TimeoutError(
                f"stream too slow: {self.got} bytes from byte {self.start} in {self.spent:.3g}s, "
                f"under {PACE >> 10} KiB per timeout={self.timeout}s"
            )
        return chunk

    @property
    def at(self) -> int:
        return self.start + self.got


class HTTPSource(RemoteMap):
    """An async map-style source: item ``i`` is the body of ``urls[i]`` (or ``decode(body)``).

    Args:
        urls: URLs, or ``(url, offset, length)`` tuples for Range reads.
        timeout: Seconds for one request (connect, headers and body) before it is retried.
        headers: Sent with every request; values of credential-like names (Authorization,
            X-Api-Key...) never appear in reprs, logs or errors, and go (with Cookie) only to
            the origin of the URL given, not to another a redirect leads to.
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
        cache: A :class:`DiskCache`: items are read from it when there, else fetched and
            written through (see docs/sources.md, "Disk cache").

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
        cache: DiskCache | None = None,
    ) -> None:
        retry = check_common(retry, max_object_size, decode, cache)
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
            items,
            client,
            decode=decode,
            retry=retry,
            on_error=on_error,
            max_skipped=max_skipped,
            cache=cache,
        )
