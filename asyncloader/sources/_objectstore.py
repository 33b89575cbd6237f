"""ObjectStoreSource: item ``i`` is the bytes of the ``i``-th key of an fsspec async filesystem.

s3fs (``s3://``), gcsfs (``gs://``), adlfs (``az://``) and any other fsspec filesystem with
``async_impl`` are used through their coroutine API (``_cat_file``, ``_find``, ``_info``) on
the loader's loop, one filesystem instance per loop (see :mod:`._perloop`).

For s3fs, defaults that would otherwise make the client the bottleneck are changed, unless
``storage_options`` sets them: botocore's pool of 10 connections (``max_pool_connections``)
is raised; s3fs's HEAD before each whole-object GET (taken when ``max_concurrency > 1``) is
avoided with ``max_concurrency=1``; s3fs's and botocore's own retries are turned off
(``retries = 1`` on the s3fs instance, botocore ``max_attempts=1``) so that :class:`Retry`
alone decides, and the attempts counted in :class:`FetchError` are real requests. A whole
object is read as one ranged GET of ``max_object_size + 1`` bytes, so an oversized object is
refused without a HEAD and without reading it all.

A stream (a shard) reads blocks of one version: the version the store reports when the stream
starts (ETag, version id, generation, modification time, size) is pinned; on S3 every block
is a GET with If-Match on the ETag, on other stores the version is asked again after each
block (one metadata request per block) unless one read took the whole object. A change is a
:class:`Permanent` failure, never a splice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader._base import call_in_thread, s3fs_client, s3fs_read_range
from asyncloader.sources._map import (
    DEFAULT_MAX_OBJECT_SIZE,
    RemoteMap,
    check_common,
    parse_items,
)
from asyncloader.sources._perloop import PerLoop
from asyncloader.sources._redact import (
    Redactor,
    option_secrets,
    redact_exception,
    redact_url,
    url_secrets,
)
from asyncloader.sources._retry import (
    Attempts,
    Permanent,
    Retry,
    Transient,
    check_size,
    retrying,
    status_of,
)

if TYPE_CHECKING:
    from asyncloader.sources._cache.disk_cache import DiskCache

_BLOCK = 8 << 20
# What identifies a version in the info dicts of s3fs, gcsfs, adlfs and fsspec's http.
_VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "LastModified",
                 "last_modified", "Last-Modified", "mtime", "updated", "size")  # fmt: skip
_UNCAPPED_POOL = 4096  # "no cap of the client's own": far above any io_concurrency in use


def import_fsspec() -> Any:
    """fsspec, or an ImportError that says how to install it."""
    try:
        import fsspec
    except ImportError as exc:
        raise ImportError(
            "object-store sources need fsspec (and s3fs for s3://): "
            "pip install 'asyncloader[remote]'"
        ) from exc
    return fsspec


def split_protocol(url: str) -> str:
    protocol, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"{redact_url(url)!r} has no protocol (such as s3://)")
    return protocol


def tuned_options(
    protocol: str, options: Mapping[str, Any], max_connections: int | None
) -> dict[str, Any]:
    """``options`` plus the throughput defaults for s3fs that the caller did not set."""
    tuned = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(tuned.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", max_connections or _UNCAPPED_POOL)
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        tuned["config_kwargs"] = config
        tuned.setdefault("max_concurrency", 1)
    return tuned


class StoreClient:
    """Reads keys through an fsspec async filesystem (the :class:`Client` of object stores).

    Args:
        protocol: ``s3``, ``gs``, ``az``...
        storage_options: Passed to the filesystem's constructor unchanged (plus defaults).
        max_connections: Cap on connections per loop, where the filesystem has one.
        max_object_size: Largest object accepted, in bytes; None: no limit.
    """

    def __init__(
        self,
        protocol: str,
        storage_options: Mapping[str, Any],
        *,
        max_connections: int | None,
        max_object_size: int | None,
    ) -> None:
        fsspec = import_fsspec()
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            extra = " (pip install 'asyncloader[remote]')" if protocol in ("s3", "s3a") else ""
            raise ImportError(
                f"{protocol}:// needs its fsspec implementation{extra}: {exc}"
            ) from exc
        if not getattr(cls, "async_impl", False):
            raise ValueError(
                f"{protocol}:// has no async fsspec filesystem; use FileSource for local files"
            )
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"{max_connections=} must be >= 1")
        self.protocol = protocol
        self.options = tuned_options(protocol, storage_options, max_connections)
        self.max_object_size = max_object_size
        self.redact = Redactor(option_secrets(storage_options))
        self._fss: PerLoop[Any] = PerLoop(self._open, self._shut)

    async def _open(self) -> Any:
        cls = import_fsspec().get_filesystem_class(self.protocol)
        loop = asyncio.get_running_loop()
        fs = cls(asynchronous=True, loop=loop, skip_instance_cache=True, **self.options)
        if self.protocol in ("s3", "s3a"):
            fs.retries = 1  # a class attribute of s3fs, not a constructor argument
        if hasattr(fs, "set_session"):
            await fs.set_session()
        return fs

    @staticmethod
    async def _shut(fs: Any) -> None:
        client = s3fs_client(fs)  # s3fs: the aiobotocore client owns the pool
        if client is not None:
            await client.close()
            return
        session = getattr(fs, "session", None)  # gcsfs, fsspec's http: an aiohttp session
        if session is not None and hasattr(session, "close") and not session.closed:
            await session.close()

    def shown(self, target: str) -> str:
        return redact_url(target)

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        fs = await self._fss.get()
        path = fs._strip_protocol(target)
        if start is not None:
            assert length is not None
            check_size(length, self.max_object_size, lambda: self.shown(target))
            data: bytes = await fs._cat_file(path, start=start, end=start + length)
            if len(data) != length:
                raise Permanent(f"range {start}+{length} goes past the end ({start + len(data)})")
            return data
        if self.max_object_size is None:
            whole: bytes = await fs._cat_file(path)
            return whole
        try:
            data = await fs._cat_file(path, start=0, end=self.max_object_size + 1)
        except Exception as exc:  # an empty object has no byte 0: S3 answers 416
            if status_of(exc) != 416:
                raise
            data = await fs._cat_file(path)
        check_size(len(data), self.max_object_size, lambda: self.shown(target))
        return data

    async def stream(
        self, target: str, start: int, pin: dict[str, Any]
    ) -> AsyncGenerator[bytes, None]:
        """Ranged GETs of 8 MiB from ``start``, all of the version pinned by one ``_info`` per
        stream (see the module's notes)."""
        fs = await self._fss.get()
        path = fs._strip_protocol(target)
        if "size" not in pin:
            info = await self._info(fs, path)
            pin["size"], pin["version"] = int(info["size"]), _version(info)
        size, pos = pin["size"], start
        while pos < size:
            end = min(size, pos + _BLOCK)
            data = await self._block(fs, path, pos, end, pin)
            if len(data) != end - pos:
                raise Transient(f"truncated range: {len(data)} of {end - pos} bytes at {pos}")
            pos = end
            yield data

    async def _info(self, fs: Any, path: str) -> dict[str, Any]:
        info: dict[str, Any]
        if self.protocol in ("s3", "s3a"):
            info = await fs._info(path, refresh=True)  # not a listing's cached entry
        else:
            info = await fs._info(path)
        return info

    async def _block(self, fs: Any, path: str, start: int, end: int, pin: dict[str, Any]) -> bytes:
        """Bytes ``[start, end)`` of the pinned version.

        Raises:
            Permanent: The object is no longer the pinned version.
        """
        version = pin["version"]
        etag = version.get("ETag")
        if self.protocol in ("s3", "s3a") and isinstance(etag, str):
            try:
                return await s3fs_read_range(fs, path, start, end, etag)
            except Exception as exc:
                if status_of(exc) != 412:
                    raise
                raise _changed(start, version, "no longer matches its ETag (412)") from None
        data: bytes = await fs._cat_file(path, start=start, end=end)
        if version and not (start == 0 and end == pin["size"]):
            now = _version(await self._info(fs, path))
            if now != version:
                raise _changed(start, version, f"is now {now}")
        return data

    async def find(self, url: str) -> list[str]:
        """The keys under ``url`` (recursively), as full URLs, sorted."""
        fs = await self._fss.get()
        found = await fs._find(fs._strip_protocol(url))
        return sorted(f"{self.protocol}://{key}" for key in found)

    async def aclose(self) -> None:
        await self._fss.aclose()

    def __repr__(self) -> str:
        return f"StoreClient({self.protocol}://, storage_options=<{sorted(self.options)}>)"


class ObjectStoreSource(RemoteMap):
    """An async map-style source: item ``i`` is the bytes of the ``i``-th key.

    Args:
        url_or_keys: A prefix URL (``s3://bucket/train/``), listed recursively into a sorted
            key list when the source is built; or a sequence of object URLs (or
            ``(url, offset, length)`` tuples for ranged reads), used in the order given.
        storage_options: Passed to the filesystem unchanged (the fsspec convention):
            ``endpoint_url`` (in ``client_kwargs`` for s3fs), path-style addressing
            (``config_kwargs={"s3": {"addressing_style": "path"}}``), ``key``, ``secret``,
            ``token``... Values never appear in reprs, logs or errors.
        retry: As for :class:`HTTPSource`; the listing is retried the same way.
        decode: ``fn(bytes) -> sample``, run on the event loop.
        on_error: ``"raise"`` (default) or ``"skip"`` (see :class:`HTTPSource`).
        max_skipped: The most items to skip with ``on_error="skip"``.
        max_object_size: Largest object accepted, in bytes (default 256 MiB); None: no limit.
        max_connections: Cap on connections per event loop (s3fs: ``max_pool_connections``);
            default none below the loader's ``io_concurrency``.
        cache: A :class:`DiskCache`: objects are read from it when there, else fetched and
            written through (see docs/sources.md, "Disk cache").
    """

    def __init__(
        self,
        url_or_keys: str | Sequence[str | tuple[str, int, int]],
        /,
        *,
        storage_options: Mapping[str, Any] | None = None,
        max_connections: int | None = None,
        retry: Retry | None = None,
        decode: Callable[[bytes], Any] | None = None,
        on_error: str = "raise",
        max_skipped: int | None = None,
        max_object_size: int | None = DEFAULT_MAX_OBJECT_SIZE,
        cache: DiskCache | None = None,
    ) -> None:
        retry = check_common(retry, max_object_size, decode, cache)
        first = url_or_keys if isinstance(url_or_keys, str) else _first_target(url_or_keys)
        client = StoreClient(
            split_protocol(first),
            storage_options or {},
            max_connections=max_connections,
            max_object_size=max_object_size,
        )
        if isinstance(url_or_keys, str):
            prefix = url_or_keys
            attempts = Attempts(client.shown(prefix), retry, client.redact)
            try:
                listed = call_in_thread(
                    lambda: asyncio.run(retrying(lambda: client.find(prefix), attempts)),
                    "asyncloader-list",
                )
            except Exception as exc:
                redact_exception(exc, client.redact.extended(url_secrets(prefix)))
                raise
            if not listed:
                raise ValueError(f"no objects under {client.shown(url_or_keys)!r}")
            url_or_keys = listed
        items = parse_items(url_or_keys, "url_or_keys")
        for target, _, _ in items:
            if split_protocol(target) != client.protocol:
                raise ValueError(f"{redact_url(target)!r} is not a {client.protocol}:// URL")
        super().__init__(
            items,
            client,
            retry=retry,
            decode=decode,
            on_error=on_error,
            max_skipped=max_skipped,
            cache=cache,
        )


def _version(info: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies the version of an object in a store's info dict (ETag, size...)."""
    return {key: info[key] for key in _VERSION_KEYS if info.get(key) is not None}


def _changed(at: int, version: Mapping[str, Any], how: str) -> Permanent:
    return Permanent(
        f"the object changed while it was read: at byte {at} it {how}, not {dict(version)}; "
        "the two versions are not spliced"
    )


def _first_target(keys: Sequence[Any]) -> str:
    if isinstance(keys, Sequence) and keys:
        first = keys[0]
        return first[0] if isinstance(first, tuple) else str(first)
    raise ValueError("url_or_keys must be a prefix URL or a non-empty sequence of object URLs")
