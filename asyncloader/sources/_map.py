"""What the three map-style sources share: items, retries, decoding, skipping, lifecycle.

A source is a list of items and a client. Item ``i`` is a target (URL, key or path) or a
``(target, offset, length)`` tuple for a ranged read. ``await source[i]`` reads it through the
client with retries (:mod:`._retry`), applies ``decode`` and, with ``on_error="skip"``,
returns a :class:`Skipped` marker in place of a bad sample. Clients live one per event loop
(:mod:`._perloop`) and are dropped when the source is pickled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader.errors import FetchError
from asyncloader.sources._cache.client import check_cache, with_cache
from asyncloader.sources._client import Client
from asyncloader.sources._redact import hide_urls, redact_exception, url_secrets
from asyncloader.sources._retry import Attempts, Retry, describe_cause, retrying
from asyncloader.sources._skips import Skipped, Skips

if TYPE_CHECKING:
    from asyncloader.sources._cache.disk_cache import DiskCache

Item = tuple[str, int | None, int | None]
DEFAULT_MAX_OBJECT_SIZE = 256 << 20


def check_common(
    retry: Retry | None,
    max_object_size: int | None,
    decode: Callable[[bytes], Any] | None,
    cache: object = None,
) -> Retry:
    """Validates the options every source takes; returns ``retry`` (the default when None)."""
    check_cache(cache)
    retry = Retry() if retry is None else retry
    if not isinstance(retry, Retry):
        raise TypeError(f"retry must be a Retry, got {type(retry).__qualname__}")
    if max_object_size is not None:
        if isinstance(max_object_size, bool) or not isinstance(max_object_size, int):
            raise TypeError(
                f"max_object_size must be an int or None, got {type(max_object_size).__qualname__}"
            )
        if max_object_size < 1:
            raise ValueError(f"{max_object_size=} must be >= 1")
    if decode is not None and not callable(decode):
        raise TypeError(f"decode must be callable or None, got {type(decode).__qualname__}")
    return retry


def check_timeout(timeout: float) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__qualname__}")
    if timeout <= 0:
        raise ValueError(f"{timeout=} must be > 0")


def parse_items(items: Sequence[Any], what: str) -> list[Item]:
    """Turns targets and ``(target, offset, length)`` tuples into Items, checking each."""
    if isinstance(items, str | bytes | os.PathLike) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a sequence of str or (str, offset, length) tuples")
    out: list[Item] = []
    for item in items:
        if isinstance(item, str | os.PathLike):
            out.append((os.fspath(item), None, None))
            continue
        if not (isinstance(item, tuple) and len(item) == 3):
            shown = hide_urls(repr(item))
            raise TypeError(f"each of {what} must be a str or (str, offset, length), got {shown}")
        target, start, length = item
        if not (isinstance(start, int) and start >= 0 and isinstance(length, int) and length >= 1):
            raise ValueError(f"range ({start!r}, {length!r}) must have offset >= 0, length >= 1")
        out.append((os.fspath(target), start, length))
    return out


class ClientSource:
    """What every source reading through a :class:`Client` reports, and how it closes.

    Subclasses set ``_client`` and ``_skips`` (a :class:`Skips`).
    """

    _client: Client
    _skips: Skips

    @property
    def skipped(self) -> int:
        """Samples skipped so far under ``on_error="skip"`` (this process, this source)."""
        return self._skips.count

    @property
    def skip_log(self) -> list[str]:
        """The last few skips: ``"target: reason"``."""
        return list(self._skips.recent)

    async def aclose(self) -> None:
        """Closes the connection pool of the running loop (otherwise closed at loop shutdown)."""
        await self._client.aclose()


class RemoteMap(ClientSource):
    """An async map-style source over ``items`` read through ``client`` (and ``cache``,
    a :class:`~asyncloader.sources.DiskCache`, when given).

    Item ``i`` is the bytes of ``items[i]`` (or ``decode(bytes)``). See the public subclasses.
    """

    def __init__(
        self,
        items: list[Item],
        client: Client,
        *,
        decode: Callable[[bytes], Any] | None,
        retry: Retry,
        on_error: str,
        max_skipped: int | None,
        cache: DiskCache | None = None,
    ) -> None:
        self._items = items
        self._client = with_cache(client, cache)
        self._decode = decode
        self._retry = retry
        self._skips = Skips(on_error, max_skipped)

    def __len__(self) -> int:
        return len(self._items)

    async def __getitem__(self, index: int) -> Any:
        """Reads item ``index`` with retries, then decodes it.

        Raises:
            FetchError: The read failed for good (with ``on_error="skip"``: once the
                ``max_skipped`` budget is spent).
            Exception: Whatever ``decode`` raised, as itself.
        """
        target, start, length = self._items[index]
        client = self._client
        attempts = Attempts(
            lambda: client.shown(target),
            self._retry,
            lambda: client.redact.extended(url_secrets(target)),
        )
        try:
            data = await retrying(lambda: self._client.read(target, start, length), attempts)
        except FetchError as exc:
            redact_exception(exc, attempts.redact)  # its chain too: before anyone reads it
            if self._skips.absorb(exc, attempts.target, exc.cause):
                return Skipped(index, attempts.target, str(exc))
            raise
        if self._decode is None:
            return data
        try:
            return self._decode(data)
        except Exception as exc:
            redact_exception(exc, attempts.redact)  # keeps the user's type: strings only
            reason = describe_cause(exc, attempts.redact)
            if self._skips.absorb(exc, attempts.target, f"decode failed: {reason}"):
                return Skipped(index, attempts.target, reason)
            raise

    @property
    def targets(self) -> list[str]:
        """The items' URLs, keys or paths, redacted, in index order."""
        return [self._client.shown(target) for target, _, _ in self._items]

    def __repr__(self) -> str:
        skip = f", skipped={self.skipped}" if self._skips.on_error == "skip" else ""
        return f"{type(self).__name__}(<{len(self)} items>, {self._client!r}{skip})"
