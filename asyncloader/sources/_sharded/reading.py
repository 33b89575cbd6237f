"""Reading the shards: one slice of one shard as raw samples (resuming a broken stream after
its last whole member), decoded and skipped as ``on_error`` says, and counting shards.

:class:`ShardReading` is the part of :class:`~.source.ShardedSource` that reads; every
exception leaving it has passed through the redactor of the client and of the shard's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from asyncloader._base import RowBlock, unwrap_group
from asyncloader.errors import FetchError
from asyncloader.sources._map import ClientSource
from asyncloader.sources._redact import Redactor, redact_exception, url_secrets
from asyncloader.sources._retry import Attempts, Retry, describe_cause
from asyncloader.sources._sharded.remainder import read_picks
from asyncloader.sources._sharded.shardplan import Slice, miscounted
from asyncloader.sources._sharded.stream import SKIPPED_POSITION
from asyncloader.sources._sharded.tar import Grouping, IgnoredMembers, members, split_key


class ShardReading(ClientSource):
    """Reads slices of the shards ``_urls`` through ``_client``.

    ``_counts`` holds each shard's sample count when known; else ``_at_most`` (one int
    ``samples_per_shard``) bounds every shard's. A shard holding more samples than declared,
    or a slice's shard fewer than it takes, raises FetchError.
    """

    _urls: list[str]
    _counts: list[int] | None
    _at_most: int | None
    _concurrency: int
    _retry: Retry
    _max_member: int | None
    _decode: Callable[[dict[str, Any]], Any] | None

    async def _count(self, shards: Sequence[int]) -> list[int]:
        """The samples in each of ``shards``, read ``shard_concurrency`` at a time."""
        limit = asyncio.Semaphore(self._concurrency)

        async def count(shard: int) -> int:
            async with limit:
                read = self.samples(Slice(shard, 0, None))
                async with contextlib.aclosing(read) as samples:
                    try:
                        return sum([_size(x) async for x in samples])
                    except Exception as exc:
                        redact_exception(exc, self._redactor(shard))
                        raise

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(count(s)) for s in shards]
        except BaseExceptionGroup as group:
            raise unwrap_group(group) from None
        return [task.result() for task in tasks]

    async def samples(self, slc: Slice) -> AsyncGenerator[dict[str, Any], None]:
        """The raw samples of one slice; resumes a broken stream after its last whole member.

        Members are grouped by :class:`.tar.Grouping` (a repeated, reserved or one too many
        field is a permanent failure); what is not a regular file is read past and logged
        (:class:`.tar.IgnoredMembers`)."""
        url = self._urls[slc.shard]
        target = self._client.shown(url)
        attempts = Attempts(target, self._retry, self._client.redact.extended(url_secrets(url)))
        pin: dict[str, Any] = {}
        offset, seen, grouping, ignored = 0, 0, Grouping(), IgnoredMembers(target)
        end = None if slc.take is None else slc.skip + slc.take
        # The most it may hold: its count, else (the last shard, counted) one int's bound.
        declared = self._at_most if self._counts is None else self._counts[slc.shard]
        while True:
            chunks = self._client.stream(url, offset, pin)
            try:
                async for member in members(chunks, offset, self._max_member, ignored):
                    attempts.progressed()
                    key, field = split_key(member.name)
                    done = grouping.close(key)
                    if done is not None:
                        if seen >= slc.skip:
                            yield {"__key__": done[0], "__url__": target, **done[1]}
                        seen += 1
                        if seen == declared:  # a sample the count did not declare
                            raise miscounted(slc.shard, declared, None)
                        if seen == end:
                            return
                    grouping.add(member, key, field)
                    offset = member.end
                done = grouping.finish()
                if done is not None:
                    if seen >= slc.skip:
                        yield {"__key__": done[0], "__url__": target, **done[1]}
                    seen += 1
                if end is not None and seen < end:
                    raise miscounted(slc.shard, declared, seen)
                return
            except Exception as exc:
                await attempts.failed(exc)
            finally:
                await chunks.aclose()

    async def items(
        self, slc: Slice, want: Callable[[int], bool]
    ) -> AsyncGenerator[tuple[int, Any], None]:
        """``(i, sample)`` for the samples ``i`` of a slice with ``want(i)``, decoded; the others
        are read past undecoded. A skipped sample (``on_error="skip"``) comes as
        ``SKIPPED_POSITION``. A slice with ``picks`` reads its shard from its first pick to
        its last, past the samples it does not pick."""
        read = self._items(slc, want) if slc.picks is None else read_picks(self._items, slc, want)
        async with contextlib.aclosing(read) as items:
            try:
                async for item in items:
                    yield item
            except Exception as exc:
                redact_exception(exc, self._redactor(slc.shard))
                raise

    def _redactor(self, shard: int) -> Redactor:
        """Hides the secrets of the client and of shard ``shard``'s URL."""
        return self._client.redact.extended(url_secrets(self._urls[shard]))

    async def _items(
        self, slc: Slice, want: Callable[[int], bool]
    ) -> AsyncGenerator[tuple[int, Any], None]:
        """:meth:`items` of a slice of consecutive samples."""
        i, failed = 0, False
        try:
            async with contextlib.aclosing(self.samples(slc)) as samples:
                async for sample in samples:
                    if isinstance(sample, RowBlock):
                        for entry in _block_items(sample, i, want):
                            yield entry
                        i += len(sample)
                        continue
                    i += 1
                    if not want(i - 1):
                        continue
                    if self._decode is None:
                        yield i - 1, sample
                        continue
                    try:
                        item = self._decode(sample)
                    except Exception as exc:
                        reason = f"decode failed: {describe_cause(exc, self._client.redact)}"
                        if not self._skips.absorb(
                            exc, f"{sample['__url__']}#{sample['__key__']}", reason
                        ):
                            raise
                        item = SKIPPED_POSITION
                    yield i - 1, item
        except FetchError as exc:
            left = (slc.take - i) if slc.take is not None else 0
            if not self._skips.absorb(exc, exc.target, exc.cause, samples=max(left, 1)):
                raise
            failed = True
        if failed and slc.take is not None:  # the positions stay: the order is unchanged
            for j in range(i, slc.take):
                if want(j):
                    yield j, SKIPPED_POSITION


def _size(sample: Any) -> int:
    """Samples ``sample`` stands for (a block of rows: its rows)."""
    return len(sample) if isinstance(sample, RowBlock) else 1


def _block_items(block: RowBlock, i: int, want: Callable[[int], bool]) -> list[tuple[int, Any]]:
    """``(i, block)`` where every sample of ``block`` (samples ``i ..``) is wanted, else
    ``(j, row)`` for the wanted ones. Blocks are rows already decoded: no decode step."""
    wanted = [want(j) for j in range(i, i + len(block))]
    if all(wanted):
        return [(i, block)] if len(block) else []
    return [(i + t, row) for t, row in enumerate(block.rows()) if wanted[t]]
