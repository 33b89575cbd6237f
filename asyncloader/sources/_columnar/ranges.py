"""Byte ranges of one version of an object, through any of the sources' clients.

A columnar file is read as a few ranges (its footer, then the column chunks a reader needs),
not as one stream, so each range is its own request. :func:`read_range` pins the object's
version on the first one (the ``pin`` dict, kept per file) and holds every later one to it:

- HTTP: the first reply's validators (a strong ETag is sent as ``If-Match``; without one, the
  Last-Modified and size are compared);
- object stores: the ETag or version fsspec reports, checked by the store's client
  (``If-Match`` on S3);
- local files: size and modification time;
- a :class:`~asyncloader.sources.DiskCache`: the object is downloaded whole into its entry
  once (as a shard is), and the ranges are read from that entry.

So a file rewritten between two ranges is an error (``Permanent``), never a splice of two
versions. After any call, ``pin["size"]`` holds the object's size.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from asyncloader.sources._cache.client import _STATE, CachedClient, _StreamState
from asyncloader.sources._client import Client
from asyncloader.sources._files import FileClient, _open_regular
from asyncloader.sources._http import (
    _CONTENT_RANGE,
    HTTPClient,
    HTTPStatusError,
    _identity,
    _same_object,
    parse_retry_after,
)
from asyncloader.sources._objectstore import StoreClient, _version
from asyncloader.sources._retry import Permanent, Transient, check_size


def span(start: int, length: int | None, size: int) -> tuple[int, int]:
    """``(first, end)`` of the range ``start``/``length`` in an object of ``size`` bytes: a
    negative ``start`` is the last ``-start`` bytes (all of a smaller object).

    Raises:
        Permanent: The range goes past the object's end.
    """
    if start < 0:
        return max(0, size + start), size
    assert length is not None
    if start + length > size:
        raise Permanent(f"range {start}+{length} goes past the end ({size} bytes)")
    return start, start + length


async def read_range(
    client: Client, target: str, start: int, length: int | None, pin: dict[str, Any]
) -> bytes:
    """``length`` bytes of ``target`` from ``start`` (``start < 0``, ``length`` None: its last
    ``-start`` bytes), of the version ``pin`` holds (pinned by the first call). One attempt:
    errors are classified for :mod:`.._retry` as the client's are."""
    if isinstance(client, CachedClient):
        return await _cached(client, target, start, length, pin)
    if isinstance(client, HTTPClient):
        return await _http(client, target, start, length, pin)
    if isinstance(client, StoreClient):
        return await _store(client, target, start, length, pin)
    if isinstance(client, FileClient):
        return await asyncio.to_thread(_file, client, target, start, length, pin)
    raise TypeError(f"no ranged reads through {type(client).__qualname__}")


def _file(
    client: FileClient, target: str, start: int, length: int | None, pin: dict[str, Any]
) -> bytes:
    path = client.shown(target)
    fd, size = _open_regular(path)
    try:
        version = {"size": size, "mtime_ns": os.fstat(fd).st_mtime_ns}
        if pin.setdefault("version", version) != version:
            raise Permanent(
                f"{path} changed while it was read: it was {pin['version']}, it is now "
                f"{version}; the two versions are not spliced"
            )
        pin["size"] = size
        first, end = span(start, length, size)
        check_size(end - first, client.max_object_size, path)
        data = os.pread(fd, end - first, first)
    finally:
        os.close(fd)
    if len(data) != end - first:
        raise Transient(f"{path} held fewer bytes than its size when read at {first}")
    return data


async def _store(
    client: StoreClient, target: str, start: int, length: int | None, pin: dict[str, Any]
) -> bytes:
    fs = await client._fss.get()
    path = fs._strip_protocol(target)
    if "size" not in pin:
        info = await client._info(fs, path)
        pin["size"], pin["version"] = int(info["size"]), _version(info)
    first, end = span(start, length, pin["size"])
    check_size(end - first, client.max_object_size, lambda: client.shown(target))
    if first == end:
        return b""
    data = await client._block(fs, path, first, end, pin)
    if len(data) != end - first:
        raise Transient(f"truncated range: {len(data)} of {end - first} bytes at {first}")
    return data


def _reply_span(resp: Any, start: int, pin: dict[str, Any]) -> tuple[int, int | None]:
    """``(first byte, object size)`` a reply to a ranged GET carries (size None: a whole
    object, sized by its body).

    Raises:
        Permanent: The object changed (412), or a ranged reply is encoded.
        Transient: The reply's range is not the one asked for.
        HTTPStatusError: Any other status.
    """
    if resp.status == 206:
        match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
        if match is None or match[3] == "*" or (start >= 0 and int(match[1]) != start):
            raise Transient(f"Content-Range {resp.headers.get('Content-Range')!r}, asked {start}")
        if not _identity(resp):
            raise Permanent("a ranged reply with a Content-Encoding")
        return int(match[1]), int(match[3])
    if resp.status == 200:
        return 0, None
    if resp.status == 412 and "etag" in pin:
        raise Permanent(
            f"the object changed while it was read: the server no longer matches ETag "
            f"{pin['etag']!r} (412); the two versions are not spliced"
        )
    after = parse_retry_after(resp.headers.get("Retry-After", ""))
    raise HTTPStatusError(resp.status, resp.reason or "", after)


async def _http(
    client: HTTPClient, target: str, start: int, length: int | None, pin: dict[str, Any]
) -> bytes:
    session = await client._sessions.get()
    wanted = f"{start}" if start < 0 else f"{start}-{start + (length or 0) - 1}"
    headers = {"Range": f"bytes={wanted}", "Accept-Encoding": "identity"}
    if "etag" in pin:
        headers["If-Match"] = pin["etag"]
    try:
        async with (
            asyncio.timeout(client.timeout),
            client._get(session, target, headers) as resp,
        ):
            first, size = _reply_span(resp, start, pin)
            _same_object(resp, first, pin, repin=False)
            body = await client._body(resp, 0, size is None, target)
    except TimeoutError as exc:
        raise TimeoutError(f"no whole reply within timeout={client.timeout}s") from exc
    if size is None:  # the server ignored the Range: the whole object came
        size = len(body)
        lo, hi = span(start, length, size)
        data = bytes(memoryview(body)[lo:hi])
    else:
        lo, hi = span(first if start >= 0 else start, length, size)
        data = bytes(body)
    if len(data) != hi - lo:
        raise Transient(f"truncated range: {len(data)} of {hi - lo} bytes at {lo}")
    pin["size"] = size
    return data


async def _cached(
    client: CachedClient, target: str, start: int, length: int | None, pin: dict[str, Any]
) -> bytes:
    state: _StreamState = pin.setdefault(_STATE, _StreamState())
    entry = await client._entry(target, client._key(target), state)
    try:
        if state.crc is not None and state.crc != entry.crc:
            raise Permanent(
                f"the object changed while it was read: its cached copy's CRC-32 was "
                f"{state.crc:08x}, it is now {entry.crc:08x}; the two are not spliced"
            )
        state.crc, pin["size"] = entry.crc, entry.size
        first, end = span(start, length, entry.size)
        check_size(end - first, getattr(client.inner, "max_object_size", None), target)
        data = await client._run(entry.read, first, end - first)
    finally:
        entry.close()
    if len(data) != end - first:
        raise Transient(f"the cached copy ended before byte {end} of {entry.size}")
    return data
