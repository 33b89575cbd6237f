"""A source's client read through a :class:`DiskCache`: the one place sources meet the cache.

``read`` (a whole object or a range, one entry each) and ``stream`` (a shard) first look for
a valid entry; on a miss, under the entry's download lock, they look again (another process
may have just written it), then fetch and write through.

A shard is downloaded whole into its temporary file, at the store's pace, then served from
the entry: a download paced by its reader would hold the download lock for as long as the
reader takes, and another rank waiting for that shard (while the first waits for it in a
collective) could wait for ever. A download that fails after receiving bytes resumes at once
where it stopped (the client checks that it is the same version: ETag, size); one that fails
before raises, for the source's retries, and its bytes stay (in the stream's ``pin``) for the
next attempt. Bytes served by one attempt of a stream and by the next come from entries with
the same CRC-32: never spliced from two versions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from asyncloader.sources._cache.disk_cache import DiskCache
from asyncloader.sources._cache.entries import EntryFile, Invalid, Partial, new_meta
from asyncloader.sources._cache.layout import entry_key
from asyncloader.sources._retry import Permanent, Transient, check_size, is_transient

if TYPE_CHECKING:
    from asyncloader.sources._client import Client
    from asyncloader.sources._redact import Redactor

T = TypeVar("T")
_STATE = "disk_cache"
_WRITE_ON_LOOP = 1 << 20  # smaller chunks (HTTP's 64 KiB) are written without a thread hop


def check_cache(cache: object) -> None:
    """Raises TypeError unless ``cache`` is a DiskCache or None."""
    if cache is not None and not isinstance(cache, DiskCache):
        raise TypeError(f"cache must be a DiskCache or None, got {type(cache).__qualname__}")


def with_cache(client: Client, cache: DiskCache | None) -> Client:
    """``client``, read through ``cache`` when one is given.

    Raises:
        TypeError: ``cache`` is not a DiskCache or None.
    """
    check_cache(cache)
    return client if cache is None else CachedClient(client, cache)


def plan_cache(client: Client, targets: Sequence[str]) -> None:
    """Tells ``client``'s cache, if it has one, the shards the running epoch will read (so
    eviction keeps them longest); a plain client ignores it."""
    if isinstance(client, CachedClient):
        client.plan(targets)


def _namespace(client: Any) -> str:
    """What besides the URL tells objects apart: an object store's endpoint."""
    options = getattr(client, "options", None)
    if not isinstance(options, Mapping):
        return ""
    kwargs = options.get("client_kwargs")
    endpoint = options.get("endpoint_url")
    if endpoint is None and isinstance(kwargs, Mapping):
        endpoint = kwargs.get("endpoint_url")
    return f"{getattr(client, 'protocol', '')}:{endpoint or ''}"


def _pinned_size(pin: dict[str, Any]) -> int | None:
    """The object's size the client pinned when its stream began (HTTP, object stores)."""
    size = pin.get("size", (pin.get("validators") or {}).get("size"))
    return None if size is None else int(size)


def _version(pin: dict[str, Any]) -> dict[str, Any]:
    """What identifies the version a stream read (ETag, Last-Modified, size...)."""
    return dict(pin.get("validators") or pin.get("version") or {})


class _StreamState:
    """What one stream (all its attempts) keeps in its ``pin``."""

    def __init__(self) -> None:
        self.crc: int | None = None  # of the entry served so far
        self.partial: Partial | None = None  # a download that failed part way


class CachedClient:
    """``inner`` (a :class:`~asyncloader.sources._client.Client`) read through ``cache``."""

    def __init__(self, inner: Client, cache: DiskCache) -> None:
        self.inner = inner
        self.cache = cache
        self.redact: Redactor = inner.redact
        self._namespace = _namespace(inner)
        self._pins = cache.pins()

    def shown(self, target: str) -> str:
        return self.inner.shown(target)

    def _key(self, target: str, start: int | None = None, length: int | None = None) -> str:
        return entry_key(self._namespace, target, start, length)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def plan(self, targets: Sequence[str]) -> None:
        self._pins.plan(self._key(t) for t in targets)

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        key = self._key(target, start, length)
        found = await self._run(self.cache.open, key, True)
        if isinstance(found, bytes):
            return self._hit(found, target)
        async with self.cache.downloading(key) as waited:
            found = await self._run(self.cache.open, key, True)
            if isinstance(found, bytes):
                return self._hit(found, target, waited)
            if isinstance(found, Invalid):
                await self._run(self.cache.drop, key, found, self.shown(target))
            data = await self.inner.read(target, start, length)
            meta = new_meta(self.shown(target), None)
            await self._run(self.cache.store, key, data, meta)
        self.cache.count(misses=1, bytes_fetched=len(data))
        return data

    def _hit(self, data: bytes, target: str, waited: bool = False) -> bytes:
        limit = getattr(self.inner, "max_object_size", None)
        check_size(len(data), limit, lambda: self.shown(target))
        self.cache.count(hits=1, bytes_hit=len(data), waits=int(waited))
        return data

    async def stream(
        self, target: str, start: int, pin: dict[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        """The object's bytes from ``start``, served from its entry (downloaded first when
        missing or invalid)."""
        key = self._key(target)
        state: _StreamState = pin.setdefault(_STATE, _StreamState())
        entry = await self._entry(target, key, state)
        try:
            if state.crc is not None and state.crc != entry.crc:
                raise Permanent(
                    f"the object changed while it was read: its cached copy's CRC-32 was "
                    f"{state.crc:08x}, it is now {entry.crc:08x}; the two are not spliced"
                )
            state.crc = entry.crc
            pos = start
            while pos < entry.size:
                chunk = await self._run(entry.read, pos)
                if not chunk:
                    raise Transient(f"the cached copy ended at byte {pos} of {entry.size}")
                pos += len(chunk)
                yield chunk
        finally:
            entry.close()
            self._pins.done(key)

    async def _entry(self, target: str, key: str, state: _StreamState) -> EntryFile:
        """The valid entry of ``target``: found, or downloaded (once per node) and written."""
        found = await self._run(self.cache.open, key, False)
        if isinstance(found, EntryFile):
            self.cache.count(hits=1, bytes_hit=found.size)
            return found
        async with self.cache.downloading(key) as waited:
            found = await self._run(self.cache.open, key, False)
            if isinstance(found, EntryFile):
                if state.partial is not None:  # another process finished it meanwhile
                    state.partial.discard()
                    state.partial = None
                self.cache.count(hits=1, bytes_hit=found.size, waits=int(waited))
                return found
            if isinstance(found, Invalid):
                await self._run(self.cache.drop, key, found, self.shown(target))
            if state.partial is None:
                state.partial = await self._run(self.cache.start, key)
            part = state.partial
            await self._download(target, part)
            state.partial = None
            meta = new_meta(self.shown(target), _version(part.inner_pin))
            entry = await self._run(self.cache.finish, key, part, meta)
        self.cache.count(misses=1, bytes_fetched=entry.size)
        return entry

    async def _download(self, target: str, part: Partial) -> None:
        """The rest of ``target`` into ``part``: resumed at once after a failure that came
        after new bytes; raised after one that came before any.

        Raises:
            Transient: It ended at another size than the one pinned when it began (the
                next attempt starts again from byte 0).
        """
        while True:
            before = part.written
            try:
                chunks = self.inner.stream(target, part.written, part.inner_pin)
                async with contextlib.aclosing(chunks):
                    async for chunk in chunks:
                        if len(chunk) < _WRITE_ON_LOOP:
                            part.write(chunk)
                        else:  # an object store's 8 MiB block: not on the loop
                            await self._run(part.write, chunk)
                break
            except Exception as exc:
                if part.written == before or not is_transient(exc):
                    raise
        size = _pinned_size(part.inner_pin)
        if size is not None and size != part.written:
            written = part.written
            part.restart()
            raise Transient(f"the download ended at byte {written} of {size}")

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"CachedClient({self.inner!r}, {self.cache!r})"
