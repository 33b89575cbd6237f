"""The async iteration of a :class:`~asyncloader.sources.Mix` with an async source: draws
made ahead on a copy of the committed cursor (the *plan*), and up to ``concurrency``
map-style samples fetched ahead; each sample is still handed out, and counted, in draw order.

An iterable source's samples are read when their draw comes, never ahead. When one runs out
with ``"all_exhausted"`` or ``"first_exhausted"`` the draws after it change: the plan is
dropped, its fetches cancelled, and drawn again from the committed cursor (``"never"``
draws the same sources whatever runs out).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from asyncloader.sources._mix.members import (
    Member,
    close_async,
    close_sync,
    open_async,
    open_sync,
    skip_async,
    skip_sync,
)
from asyncloader.sources._mix.runs import BLOCK, Run


class AsyncRun(Run):
    """A Run with an async source, iterated by :class:`AheadSamples`."""

    async def pull(self, i: int) -> Any:
        iterator = self.iterators.get(i)
        if iterator is None:
            iterator = self.iterators[i] = await self._open(i)
        if self.members[i].is_async:
            return await anext(iterator)
        try:
            return next(iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def _open(self, i: int) -> Any:
        c, member = self.cursor, self.members[i]
        left = c.taken[i] - c.own_taken[i]
        while True:
            if member.is_async:
                iterator: Any = open_async(member, c.epochs[i], c.own[i])
                dropped = await skip_async(iterator, left)
            else:
                iterator = open_sync(member, c.epochs[i], c.own[i])
                dropped = skip_sync(iterator, left)
            left = self.replay_left(i, dropped, left)
            if not left:
                return iterator
            await self._close(i, iterator)

    async def _close(self, i: int, iterator: Any) -> None:
        if self.members[i].is_async:
            await close_async(self.members[i], iterator)
        else:
            close_sync(self.members[i], iterator)

    async def aran_out(self, i: int) -> None:
        await self._close(i, self.iterators.pop(i, None))
        self.ran_out(i)

    async def close(self) -> None:
        self.keep_own()
        for i, iterator in list(self.iterators.items()):
            await self._close(i, iterator)
        self.iterators.clear()


#: A planned draw: (position, source, item or None, future of its sample or None, made by
#: the whole rule: see :meth:`.run.Run.block`).
Entry = tuple[int, int, Any, "asyncio.Future[Any] | None", bool]


class AheadSamples:
    """The samples of an :class:`AsyncRun`'s epoch, with up to ``concurrency`` map-style
    fetches started ahead on a plan (see the module docstring).

    ``_fetching`` counts the queued entries that hold a fetch, at most ``concurrency``.
    Liveness: the entry :meth:`__anext__` awaits is the queue's head, filled before it is
    read (:meth:`_fill` stops only with fetches queued, or the plan's epoch over); its fetch
    was started when it was queued, so nothing waits on a fetch not started. Dropped entries
    (a replan, close, a cancelled ``__anext__``) have their fetches cancelled and the count
    reset; a plan out of step with the committed cursor is drawn again from it."""

    def __init__(self, run: AsyncRun, concurrency: int) -> None:
        self._run, self._concurrency = run, concurrency
        self._plan = run.cursor.copy(run.setup.seed)
        self._queue: deque[Entry] = deque()
        self._fetching = 0
        self._fetchers = [self._fetcher(m) for m in run.members]

    @staticmethod
    def _fetcher(member: Member) -> Any:
        if not member.is_map:
            return None
        getitem = member.source.__getitem__
        if member.is_async:
            return lambda item: asyncio.ensure_future(getitem(item))

        def fetch(item: Any) -> asyncio.Future[Any]:
            future = asyncio.get_running_loop().create_future()
            try:
                future.set_result(getitem(item))
            except Exception as exc:
                future.set_exception(exc)
            return future

        return fetch

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    def _fill(self) -> None:
        """Draws ahead on the plan until ``concurrency`` fetches are under way (or the plan
        holds ``4 * concurrency`` draws, or its epoch is over)."""
        run, plan, queue, limit = self._run, self._plan, self._queue, self._concurrency
        while self._fetching < limit and len(queue) < 4 * limit:
            picks, items, by_rule = run.block(plan, max(1, min(BLOCK, limit - self._fetching)))
            if not picks:
                return
            for i, item in zip(picks, items, strict=True):
                fetch = self._fetchers[i]
                queue.append((plan.position, i, item, fetch and fetch(item), by_rule))
                self._fetching += fetch is not None
                plan.took(i)

    def _replan(self) -> None:
        """Drops the plan (its fetches cancelled) and plans again from what was handed out."""
        self._cancel()
        self._plan = self._run.cursor.copy(self._run.setup.seed)

    def _cancel(self) -> None:
        for entry in self._queue:
            future = entry[3]
            if future is not None and not future.cancel() and not future.cancelled():
                future.exception()  # a failure nobody will take: retrieved, not logged
        self._queue.clear()
        self._fetching = 0

    async def __anext__(self) -> Any:
        run = self._run
        while True:
            i, head = await self._next_draw()
            if head[3] is not None:
                return await self._fetched(i, head)
            try:
                return await self._pulled(i)
            except StopAsyncIteration:
                await run.aran_out(i)
                if run.setup.stop != "never":
                    self._replan()

    async def _next_draw(self) -> tuple[int, Entry]:
        """The source of the next draw and its plan entry, the plan checked against the
        committed cursor (a draw by the whole rule is made on it again).

        Raises:
            StopAsyncIteration: The epoch is over.
        """
        run = self._run
        c = run.cursor
        while True:
            self._fill()
            head = self._queue[0] if self._queue else None
            i = head[1] if head is not None and not head[4] else run.draws.pick(c)
            if i is None:
                await self.aclose(ended=True)
                raise StopAsyncIteration
            if head is not None and head[0] == c.position and head[1] == i:
                return i, head
            self._replan()  # the plan went another way: not expected, but never trusted

    async def _pulled(self, i: int) -> Any:
        """The next sample of iterable source ``i``, counted once it is in hand (raises
        StopAsyncIteration when it has none left)."""
        run = self._run
        try:
            sample = await run.pull(i)
        except StopAsyncIteration:
            raise
        except Exception as exc:
            run.note(exc, i, None)
            raise
        self._queue.popleft()
        run.cursor.took(i)
        return sample

    async def _fetched(self, i: int, head: Entry) -> Any:
        """The sample of a map-style draw fetched ahead, counted once it is in hand."""
        run, future = self._run, head[3]
        assert future is not None
        self._queue.popleft()
        self._fetching -= 1
        try:
            sample = await future
        except Exception as exc:
            run.note(exc, i, head[2])
            raise
        run.cursor.took(i)
        return sample

    async def aclose(self, ended: bool = False) -> None:
        """Cancels the fetches ahead and closes the sources' iterators (``ended``: the epoch
        is over, its final state kept first)."""
        self._cancel()
        if ended and self._run.final is None:
            self._run.ended()
        await self._run.close()
