"""Bounded async fan-out: fetches the samples of a batch on the event loop.

Per sample, so one slow sample never holds a whole batch's worth of requests back. At most
``io_concurrency`` samples are being fetched at once across all batches of an epoch:
``slots.value + fetching == io_concurrency`` at every await point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asyncloader._failure import Failure


class _SampleFailed(Exception):
    """Carries one sample's Failure out of the batch's TaskGroup, cancelling its siblings."""

    def __init__(self, failure: Failure) -> None:
        super().__init__()
        self.failure = failure


class Fetcher:
    """Fetches samples with ``get(index)``, at most ``io_concurrency`` at once.

    Args:
        get: Returns an awaitable of the sample at ``index`` (a coroutine for async sources, a
            thread-pool future for sync ones).
        io_concurrency: The bound on samples being fetched at once.
    """

    def __init__(self, get: Callable[[Any], Awaitable[Any]], io_concurrency: int) -> None:
        self._get = get
        self._slots = asyncio.Semaphore(io_concurrency)
        self.fetching = 0
        self.max_fetching = 0

    async def _one(self, seq: int, indices: Sequence[Any], out: list[Any], pos: int) -> None:
        index = indices[pos]
        async with self._slots:
            self.fetching += 1
            self.max_fetching = max(self.max_fetching, self.fetching)
            try:
                out[pos] = await self._get(index)
            except Exception as exc:
                raise _SampleFailed(Failure.capture(exc, "fetch", seq, indices, index)) from None
            finally:
                self.fetching -= 1

    async def fetch(self, seq: int, indices: Sequence[Any]) -> list[Any] | Failure:
        """Returns the samples of batch ``seq`` in ``indices`` order, or the first Failure."""
        out: list[Any] = [None] * len(indices)
        failed: list[Failure] = []
        try:
            async with asyncio.TaskGroup() as tg:
                for pos, index in enumerate(indices):
                    tg.create_task(self._one(seq, indices, out, pos), name=f"fetch:{index}")
        except* _SampleFailed as group:
            failed.extend(e.failure for e in group.exceptions if isinstance(e, _SampleFailed))
        return failed[0] if failed else out
