"""One epoch of a ShardedSource: concurrent shard readers feeding a bounded shuffle buffer.

Structured: the readers are tasks of one TaskGroup, owned by a producer task that ends by
putting the end-of-stream mark or the first error on the queue (on every path but
cancellation, which only :meth:`ShardStream.aclose` does). Closing the stream cancels the
producer and waits for it, so no reader outlives the epoch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from asyncloader.sources._shardplan import Slice

_END = object()


class ShardStream:
    """One pass: reader tasks in one TaskGroup feed a bounded queue; a shuffle buffer drains it.

    Invariant: ``len(buffer) <= shuffle_buffer`` and ``queue.qsize() <= shard_concurrency``.
    """

    def __init__(
        self,
        slices: list[Slice],
        read: Callable[[Slice, asyncio.Queue[Any]], Awaitable[None]],
        rng: random.Random | None,
        buffer_size: int,
        concurrency: int,
    ) -> None:
        self._slices = slices
        self._read = read
        self._rng = rng
        self._size = buffer_size if rng is not None else 1
        self._concurrency = concurrency
        self._queue: asyncio.Queue[Any] = asyncio.Queue(concurrency)
        self._buffer: list[Any] = []
        self._task: asyncio.Task[None] | None = None
        self._done = False

    def __aiter__(self) -> ShardStream:
        return self

    async def _produce(self) -> None:
        final: Any = _END
        try:
            todo = iter(self._slices)

            async def worker() -> None:
                for slc in todo:
                    await self._read(slc, self._queue)

            async with asyncio.TaskGroup() as tg:
                for i in range(min(self._concurrency, len(self._slices))):
                    tg.create_task(worker(), name=f"shard-reader:{i}")
        except BaseExceptionGroup as group:
            final = _first(group)
        except Exception as exc:
            final = exc
        await self._queue.put(final)

    async def __anext__(self) -> Any:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._produce(), name="shards")
        while not self._done and len(self._buffer) < self._size:
            item = await self._queue.get()
            if item is _END:
                self._done = True
            elif isinstance(item, BaseException):
                self._done = True
                self._buffer.clear()
                raise item
            else:
                self._buffer.append(item)
        if not self._buffer:
            raise StopAsyncIteration
        if self._rng is not None:
            i = self._rng.randrange(len(self._buffer))
            self._buffer[i], self._buffer[-1] = self._buffer[-1], self._buffer[i]
        return self._buffer.pop() if self._rng is not None else self._buffer.pop(0)

    async def aclose(self) -> None:
        """Cancels the readers and waits for them. Idempotent."""
        task, self._task = self._task, None
        self._done = True
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
