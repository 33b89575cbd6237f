"""ParquetSource: the rows of Parquet files, local or remote, as an async iterable source.

::

    footers (one suffix range each, all files at once) ─► row groups, their row counts
    plan (row groups in a seeded order, split by rows across ranks and workers)
       ─► per row group (≤ row_group_concurrency at once): its column chunks' ranges,
          neighbours joined, fetched at once ─► decoded in a thread ─► rows

It is a :class:`~asyncloader.sources.ShardedSource` whose shards are row groups: the order,
the rank and worker split, exact resume (also at another world size), the shuffle buffer,
``on_error="skip"`` and the disk cache are the sharded source's, with the same guarantees.
Only a row group's selected column chunks are fetched; every range of a file is held to the
version its footer was read from (see :mod:`.ranges`).

Memory bound: ``shuffle_buffer`` rows, plus per row group being read its column chunks and
decoded rows (at most ``2 * row_group_concurrency`` row groups are read ahead of the consumer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader._base import unwrap_group
from asyncloader.errors import FetchError
from asyncloader.sources._columnar.arrow_rows import ArrowRows
from asyncloader.sources._columnar.parquet_file import (
    TAIL,
    chunk_ranges,
    decode_rows,
    footer_span,
    import_pyarrow,
    leaf_columns,
    parse_footer,
)
from asyncloader.sources._columnar.ranges import read_range
from asyncloader.sources._columnar.row_filter import RowFilter
from asyncloader.sources._map import DEFAULT_MAX_OBJECT_SIZE
from asyncloader.sources._redact import redact_url, url_secrets
from asyncloader.sources._retry import Attempts, Permanent, Retry, check_size, describe_cause
from asyncloader.sources._sharded.remainder import StreamCut
from asyncloader.sources._sharded.shardplan import Slice
from asyncloader.sources._sharded.source import ShardedSource
from asyncloader.sources._skips import Skips

if TYPE_CHECKING:
    from asyncloader.sources._cache.disk_cache import DiskCache


class ParquetSource(ShardedSource):
    """An async iterable of the rows of Parquet files: one dict per row, values as pyarrow's
    ``to_pylist()`` gives them (the loader's default collate batches them as DataLoader
    collates dicts).

    Args:
        urls: Parquet files: local paths, ``http(s)://`` URLs or fsspec URLs (``s3://...``).
        columns: The top-level columns to read (None: all); only their chunks are fetched.
        shuffle: Shuffle the row groups' order each epoch (seeded by ``seed`` and the epoch,
            see :meth:`set_epoch`) and the rows through a buffer of ``shuffle_buffer``.
        seed, shuffle_buffer, shuffle_initial: As for :class:`ShardedSource`.
        row_group_concurrency: Row groups fetched and decoded at once.
        rank, world_size, distributed_tail: As for :class:`ShardedSource`; the ranks split
            the epoch's rows (row groups laid end to end) into equal shares.
        storage_options, headers, cache, timeout, retry, max_connections: As for
            :class:`ShardedSource`.
        on_error: ``"raise"`` (default), or ``"skip"``: a row group that cannot be read or
            decoded is skipped, its rows counted in ``skipped``. A file whose footer cannot
            be read always raises: its rows cannot be counted.
        max_skipped: The most rows to skip with ``on_error="skip"``.
        max_object_size: Largest footer, and largest row group's selected chunks, in bytes.
        filter: A pyarrow expression (``pyarrow.compute.field("lang") == "en"``): only the
            rows it keeps are yielded. Row groups whose statistics rule it out are never
            read; the rows the others keep are counted before the first iteration, from the
            filter's columns alone, so the order, the ranks' equal shares and resume stay
            exact. The filter's columns need not be among ``columns``.

    The footers are read (one range request each, concurrently) before the first iteration,
    or by :meth:`count_samples`, or by ``len()``.

    Raises (at run time):
        FetchError: A file that is not Parquet, truncated or corrupt (naming the file, and
            the row group where one is known), or rewritten while it was read; transient
            failures are retried first.
    """

    def __init__(
        self,
        urls: Sequence[str],
        /,
        *,
        columns: Sequence[str] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        shuffle_initial: int | None = None,
        row_group_concurrency: int = 8,
        rank: int | None = None,
        world_size: int | None = None,
        distributed_tail: str = "drop",
        storage_options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        cache: DiskCache | None = None,
        timeout: float = 30.0,
        retry: Retry | None = None,
        on_error: str = "raise",
        max_skipped: int | None = None,
        max_object_size: int | None = DEFAULT_MAX_OBJECT_SIZE,
        max_connections: int | None = None,
        filter: Any = None,  # pyarrow's and datasets' name for it
    ) -> None:
        import_pyarrow()
        row_filter = None if filter is None else RowFilter(filter)
        if columns is not None and (isinstance(columns, str) or not columns):
            raise ValueError(
                f"columns must be a non-empty list of column names or None, got {columns!r}"
            )
        super().__init__(
            urls,
            seed=seed,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            shuffle_initial=shuffle_initial,
            shard_concurrency=row_group_concurrency,
            rank=rank,
            world_size=world_size,
            distributed_tail=distributed_tail,
            storage_options=storage_options,
            headers=headers,
            cache=cache,
            timeout=timeout,
            retry=retry,
            max_object_size=max_object_size,
            max_connections=max_connections,
        )
        self._skips = Skips(on_error, max_skipped)  # counts come from the footers
        # Unshuffled, rows come in file order; the next row groups are read ahead meanwhile.
        self._width = row_group_concurrency if shuffle else 1
        self._columns = None if columns is None else [str(c) for c in columns]
        self._files = list(self._urls)
        #: Per file: its size and footer bytes, once read (travels to workers).
        self._footers: dict[int, tuple[int, bytes]] = {}
        #: Per file: the version its ranges are held to (see .ranges).
        self._pins: dict[int, dict[str, Any]] = {}
        #: The shards: ``(file, row group)``, once the footers are read.
        self._units: list[tuple[int, int]] = []
        self._parsed: dict[int, Any] = {}
        self._filter = row_filter

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_parsed"] = {}  # pyarrow's FileMetaData: parsed again from the footer bytes
        state["_pins"] = {f: _plain_pin(pin) for f, pin in self._pins.items()}
        return state

    def _counts_first(self, world: int, history: Sequence[StreamCut]) -> bool:
        return True  # the row groups themselves come from the footers

    async def count_samples(self) -> list[int]:
        """The rows of each row group, from the files' footers (read once, concurrently)."""
        if self._counts is None:
            limit = asyncio.Semaphore(max(self._concurrency, 16))

            async def one(f: int) -> None:
                async with limit:
                    await self._read_footer(f)

            try:
                async with asyncio.TaskGroup() as tg:
                    for f in range(len(self._files)):
                        tg.create_task(one(f))
            except BaseExceptionGroup as group:
                raise unwrap_group(group) from None
            units, counts = [], []
            for f in range(len(self._files)):
                meta = self._metadata(f)
                for g in self._groups(f):
                    units.append((f, g))
                    counts.append(meta.row_group(g).num_rows)
            if self._filter is not None:
                units, counts = await self._kept(units)
            self._units, self._urls = units, [self._files[f] for f, _ in units]
            self._counts = counts
        return list(self._counts)

    def _groups(self, f: int) -> list[int]:
        """File ``f``'s row groups that may hold rows (with a filter: its statistics)."""
        groups = list(range(self._metadata(f).num_row_groups))
        if self._filter is not None:
            size, footer = self._footers[f]
            kept = self._filter.row_groups(size, footer)
            return groups if kept is None else sorted(set(kept) & set(groups))
        return groups

    async def _kept(self, units: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[int]]:
        """``units`` that keep rows under the filter, and how many each keeps (read from
        the filter's columns, ``row_group_concurrency`` row groups at once)."""
        assert self._filter is not None
        limit = asyncio.Semaphore(self._concurrency)
        row_filter = self._filter

        async def kept(f: int, g: int) -> int:
            async with limit:
                columns = row_filter.columns(self._metadata(f).schema.to_arrow_schema())
                table = await self._read_group(f, g, columns, None)
            return int((await asyncio.to_thread(row_filter.apply, table, None)).num_rows)

        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(kept(f, g)) for f, g in units]
        except BaseExceptionGroup as group:
            raise unwrap_group(group) from None
        counted = [(unit, task.result()) for unit, task in zip(units, tasks, strict=True)]
        return [u for u, n in counted if n], [n for _, n in counted if n]

    def __len__(self) -> int:
        """Rows this rank yields per epoch; reads the footers first when not read yet."""
        if self._counts is None:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, self.count_samples()).result()
        return super().__len__()

    def _attempts(self, f: int, where: str = "") -> Attempts:
        url = self._files[f]
        shown = self._client.shown(url) + where
        return Attempts(shown, self._retry, self._client.redact.extended(url_secrets(url)))

    async def _range(self, f: int, start: int, length: int | None, attempts: Attempts) -> bytes:
        pin = self._pins.setdefault(f, {})
        while True:
            try:
                data = await read_range(self._client, self._files[f], start, length, pin)
                attempts.progressed()
                return data
            except Exception as exc:
                await attempts.failed(exc)

    async def _read_footer(self, f: int) -> None:
        """Reads file ``f``'s footer (one suffix range, two for a footer over ``TAIL``)."""
        if f in self._footers:
            return
        attempts = self._attempts(f)
        tail = await self._range(f, -TAIL, None, attempts)
        size = int(self._pins[f]["size"])
        try:
            start, length = footer_span(tail, size, self._max_member)
        except Permanent as exc:
            raise FetchError(attempts.target, attempts.total + 1, str(exc), "not retried") from None
        if length > len(tail):
            tail = await self._range(f, start, length, attempts)
        self._footers[f] = (size, tail[len(tail) - length :])
        self._metadata(f)

    def _metadata(self, f: int) -> Any:
        meta = self._parsed.get(f)
        if meta is None:
            footer = self._footers[f][1]
            try:
                meta = parse_footer(footer)
            except Permanent as exc:
                raise FetchError(self._attempts(f).target, 1, str(exc), "not retried") from None
            self._parsed[f] = meta
        return meta

    async def samples(self, slc: Slice) -> AsyncGenerator[ArrowRows, None]:  # type: ignore[override]
        """The rows ``[skip, skip + take)`` of one row group (of those the filter keeps), as
        one block."""
        f, group = self._units[slc.shard]
        meta = self._metadata(f)
        every = self._counts[slc.shard] if self._counts else meta.row_group(group).num_rows
        end = every if slc.take is None else slc.skip + slc.take
        rows = range(slc.skip, end)
        if not rows:
            return
        if self._filter is None:
            decoded = await self._read_group(f, group, self._columns, rows)
        else:
            columns = self._filter.decoded(meta.schema.to_arrow_schema(), self._columns)
            table = await self._read_group(f, group, columns, None)
            kept = await asyncio.to_thread(self._filter.apply, table, self._columns)
            if kept.num_rows != every:
                where = self._attempts(f, f"#row_group={group}").target
                counted = f"the filter kept {kept.num_rows} rows, {every} when counted"
                raise FetchError(where, 1, counted, "not retried")
            decoded = kept.slice(rows.start, len(rows))
        # One block: the loader slices its batches off it, or the stream makes its rows a
        # few at a time (made here, in one go, they would hold the loop for the whole group).
        yield ArrowRows(decoded)

    async def _read_group(
        self, f: int, group: int, columns: Sequence[str] | None, rows: range | None
    ) -> Any:
        """Rows ``rows`` (None: all) of ``columns`` (None: all) of file ``f``'s row group
        ``group``: their chunks fetched at once, decoded in a thread."""
        meta, (size, footer) = self._metadata(f), self._footers[f]
        if rows is None:
            rows = range(meta.row_group(group).num_rows)
        attempts = self._attempts(f, f"#row_group={group}")
        leaves = leaf_columns(meta, columns)  # ValueError: a column it does not have
        try:
            ranges = chunk_ranges(meta, group, leaves, size)
            check_size(sum(len(r) for r in ranges), self._max_member, attempts.target)
        except Permanent as exc:
            raise FetchError(attempts.target, 0, describe_cause(exc, attempts.redact)) from None
        try:
            async with asyncio.TaskGroup() as tg:
                reads = [tg.create_task(self._range(f, r.start, len(r), attempts)) for r in ranges]
        except BaseExceptionGroup as group_error:
            raise unwrap_group(group_error) from None
        parts = [(r.start, read.result()) for r, read in zip(ranges, reads, strict=True)]
        parts.append((size - len(footer), footer))
        try:
            return await asyncio.to_thread(decode_rows, meta, size, parts, group, columns, rows)
        except Permanent as exc:
            raise FetchError(attempts.target, attempts.total + 1, str(exc), "not retried") from None

    def __repr__(self) -> str:
        first = redact_url(self._files[0])
        return f"ParquetSource(<{len(self._files)} files: {first}, ...>, {self._client!r})"


def _plain_pin(pin: dict[str, Any]) -> dict[str, Any]:
    """What of a file's pin travels to a worker: the version, not a cache's open state."""
    return {k: v for k, v in pin.items() if isinstance(v, str | int | float | dict)}
