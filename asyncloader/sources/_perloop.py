"""One client (an aiohttp session, an fsspec filesystem) per running event loop.

Clients of aiohttp and aiobotocore are bound to the loop they were made on. A loader iterated
with ``async for`` runs on the caller's loop; iterated with ``for`` it runs its epochs on the
loader's own loop thread (one per loader, kept across epochs, so a client is reused by the
next epoch). So a source makes its client lazily, on the loop it is first awaited on, keyed by
that loop, and never uses it from another.

Each client is closed on its own loop when that loop shuts down its async generators, which
``asyncio.run``, ``asyncio.Runner`` and the loader's loop thread (when the loader closes) do
before closing the loop: the
client is held by a tiny async generator, first iterated on the loop (which registers it for
``loop.shutdown_asyncgens()``), whose ``finally`` closes the client. ``aclose()`` closes the
running loop's client earlier. A loop closed without ``shutdown_asyncgens()`` leaks its client
until the next ``get`` from another loop drops it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """Makes, caches and closes one ``T`` per running event loop.

    Args:
        make: Creates the client; awaited on the loop that will use it.
        close: Closes a client; awaited on the loop that made it.
    """

    def __init__(
        self, make: Callable[[], Awaitable[T]], close: Callable[[T], Awaitable[None]]
    ) -> None:
        self._make = make
        self._close = close
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, tuple[T, AsyncGenerator[None, None]]] = {}

    def __len__(self) -> int:
        """Clients alive now (one per loop that has used this source and not shut down)."""
        return len(self._clients)

    async def get(self) -> T:
        """The running loop's client, made on first use."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None:
            return entry[0]
        with self._lock:
            for stale in [other for other in self._clients if other.is_closed()]:
                del self._clients[stale]
        client = await self._make()
        entry = self._clients.get(loop)
        if entry is not None:  # another task of this loop made one meanwhile
            await self._close(client)
            return entry[0]
        keeper = self._keep(loop, client)
        await anext(keeper)  # registers the keeper for loop.shutdown_asyncgens()
        with self._lock:
            self._clients[loop] = (client, keeper)
        return client

    async def _keep(self, loop: asyncio.AbstractEventLoop, client: T) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                self._clients.pop(loop, None)
            await self._close(client)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without clients or lock: a copy in another process makes its own."""
        return {"make": self._make, "close": self._close}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._make, self._close = state["make"], state["close"]
        self._lock = threading.Lock()
        self._clients = {}

    async def aclose(self) -> None:
        """Closes the running loop's client, if it has one. Idempotent."""
        entry = self._clients.get(asyncio.get_running_loop())
        if entry is not None:
            await entry[1].aclose()
