"""What a source reads bytes through: the :class:`Client` protocol.

Its own module, a leaf, so that the concrete clients (:mod:`._http`, :mod:`._objectstore`,
:mod:`._files`), the sources built on them (:mod:`._map`, the sharded source) and the cache's
wrapper (:mod:`._cache.client`) all import it without importing one another.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from asyncloader.sources._redact import Redactor


class Client(Protocol):
    """Reads bytes for a source; one attempt per call, errors classified by :mod:`._retry`."""

    redact: Redactor

    def shown(self, target: str) -> str:
        """``target`` as it may be shown: credentials and query values hidden."""
        ...

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        """The whole object, or ``length`` bytes from ``start`` (to the end when None)."""
        ...

    def stream(self, target: str, start: int, pin: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        """Chunks of the object from byte ``start``; ``pin`` keeps what must not change
        between the attempts of one stream (an ETag, a size)."""
        ...

    async def aclose(self) -> None:
        """Closes the running loop's connection pool."""
        ...
