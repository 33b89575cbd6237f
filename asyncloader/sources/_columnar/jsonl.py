"""JsonlSource: the lines of JSON Lines files, plain or compressed, as an async iterable source.

It is a :class:`~asyncloader.sources.ShardedSource` whose shards are files and whose samples
are their lines: the order, the rank and worker split, exact resume (also at another world
size), the shuffle buffer (files in a seeded order plus a buffer of lines), ``on_error``
and the disk cache are the sharded source's, with the same guarantees.

A file streams as it is read and is decompressed as it arrives (``.gz``; ``.zst`` with the
``zstandard`` package). Blank lines are not samples. A stream that breaks is resumed: a plain
file at the byte after its last whole line, a compressed one from its start, decompressing
past the lines it had already given (a compressed stream has no byte offset to resume at).

Resuming an epoch from a saved state: a plain file is read from a byte offset at or before
its first line still due. While reading a plain file the source notes, about every
:data:`~.line_runs.MARK_BYTES`, which line starts at which byte (a fact about the file,
whatever was delivered), and ``state_dict()`` carries the last :data:`MARKS_KEPT` marks of the last
:data:`FILES_MARKED` files read; a resume starts at the last mark before its line, and reads
past the lines between without parsing them. A compressed file, or a plain one without a mark
(a state from another world size, or one that fell more than the marks cover behind the
reading), is read from its start the same way.

``parse="arrow"`` parses blocks of lines with pyarrow's JSON reader, in a thread, and yields
each block as one :class:`~.arrow_rows.ArrowRows`: under the default collate the batch is
built from the columns. Its rows are what pyarrow reads, which is what Hugging Face
``datasets`` gives of JSON Lines, and can differ from ``json.loads`` (see the class).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections import deque
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader.sources._columnar.arrow_rows import ArrowRows
from asyncloader.sources._columnar.line_runs import LineRuns, Run, note
from asyncloader.sources._map import DEFAULT_MAX_OBJECT_SIZE
from asyncloader.sources._redact import redact_url, url_secrets
from asyncloader.sources._retry import Attempts, Retry
from asyncloader.sources._sharded.shardplan import Slice, miscounted
from asyncloader.sources._sharded.source import ShardedSource

if TYPE_CHECKING:
    from asyncloader.sources._cache.disk_cache import DiskCache

COMPRESSIONS = ("infer", None, "gzip", "zstd")
PARSERS = ("json", "arrow")
#: With ``parse="arrow"``, a block is parsed once its lines hold this many bytes (or at the
#: file's end): pyarrow parses a block's 1 MiB pieces in parallel, and larger blocks go faster
#: (99k rows/s at 8 MiB against 82k at 2.5 MiB, on 2 cores), at this much memory per block.
BLOCK_BYTES = 8 << 20
#: With ``parse="arrow"``, blocks queued per file being read.
BLOCKS_QUEUED = 2
#: Lines queued per file being read: the reader and the consumer wake once per this many.
LINES_QUEUED = 64
#: Marks kept per file (the most recent); a resume whose line lies before them all starts at
#: the file's start.
MARKS_KEPT = 32
#: Files whose marks are kept (the most recently read).
FILES_MARKED = 8
_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def compression_of(url: str, compression: str | None) -> str | None:
    """The compression of ``url``: ``compression``, or with ``"infer"`` its suffix's."""
    if compression != "infer":
        return compression
    path = url.split("?", 1)[0].lower()
    return next((kind for suffix, kind in _SUFFIXES.items() if path.endswith(suffix)), None)


class JsonlSource(ShardedSource):
    """An async iterable of the lines of JSON Lines files, each ``json.loads``-ed.

    Args:
        urls: Files: local paths, ``http(s)://`` URLs or fsspec URLs (``s3://...``).
        compression: ``"infer"`` (default: ``.gz``/``.gzip`` gzip, ``.zst``/``.zstd`` zstd,
            else none), None, ``"gzip"`` or ``"zstd"``.
        lines_per_file: Lines in each file (as ``samples_per_shard``); without, the files
            are counted (read once) where ranks, ``len()`` or ``on_error="skip"`` need it.
        shuffle: Shuffle the files' order each epoch, and the lines through a buffer.
        seed, shuffle_buffer, shuffle_initial, rank, world_size, distributed_tail,
        storage_options, headers, cache, timeout, retry, max_connections: As for
            :class:`ShardedSource`; ``file_concurrency`` is its ``shard_concurrency``.
        on_error: ``"raise"`` (default), or ``"skip"``: a malformed line is skipped, a file
            that fails for good skips its remaining lines; each counted in ``skipped``.
        max_skipped: The most lines to skip with ``on_error="skip"``.
        max_object_size: Longest line accepted, in bytes (decompressed).
        parse: ``"json"`` (default): each line ``json.loads``-ed. ``"arrow"``: blocks of
            lines read by pyarrow's JSON reader (as ``datasets`` reads JSON Lines), in a
            thread; with the default collate the batch is built from the columns, several
            times faster. The rows differ from ``json.loads``'s where pyarrow infers one type
            per column of a block: a key missing from a line is ``None``, integers in a
            column with floats are floats, a nested object has every key of its block. A
            block pyarrow cannot read as one table (a line that is not an object, types that
            conflict, a malformed line) is parsed line by line with ``json.loads``.

    Raises (at run time):
        ValueError: A malformed line, naming the file and line number (1-based, blank
            lines counted).
        FetchError: A file that cannot be read or decompressed.
    """

    def __init__(
        self,
        urls: Sequence[str],
        /,
        *,
        compression: str | None = "infer",
        lines_per_file: int | Sequence[int] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        shuffle_initial: int | None = None,
        file_concurrency: int = 4,
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
        parse: str = "json",
    ) -> None:
        if parse not in PARSERS:
            raise ValueError(f"parse must be one of {PARSERS}, got {parse!r}")
        if on_error == "skip" and lines_per_file is None:
            raise ValueError("on_error='skip' needs lines_per_file, to count what it skips")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        super().__init__(
            urls,
            samples_per_shard=lines_per_file,
            seed=seed,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            shuffle_initial=shuffle_initial,
            shard_concurrency=file_concurrency,
            rank=rank,
            world_size=world_size,
            distributed_tail=distributed_tail,
            decode=_parse_line,
            storage_options=storage_options,
            headers=headers,
            cache=cache,
            timeout=timeout,
            retry=retry,
            on_error=on_error,
            max_skipped=max_skipped,
            max_object_size=max_object_size,
            max_connections=max_connections,
        )
        self._compression, self._block = compression, BLOCK_BYTES if parse == "arrow" else 0
        # Unshuffled, lines come in file order; the next files are read ahead meanwhile.
        self._width = file_concurrency if shuffle else 1
        self._depth = BLOCKS_QUEUED if parse == "arrow" else LINES_QUEUED
        #: shard -> marks ``(line index, line number, byte offset)`` of its plain file
        self._marks: dict[int, deque[tuple[int, int, int]]] = {}

    def state_dict(self) -> dict[str, Any]:
        """:meth:`ShardedSource.state_dict`, and ``"line_marks"``: per recently read plain
        file, where some of its lines start (``[index, number, offset, ...]`` flat), so that
        a resume reads from there."""
        state = super().state_dict()
        state["line_marks"] = {
            str(shard): [n for mark in marks for n in mark] for shard, marks in self._marks.items()
        }
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        for shard, flat in state.get("line_marks", {}).items():
            marks = self._marks_of(int(shard))
            for k in range(0, len(flat) - 2, 3):
                note(marks, (int(flat[k]), int(flat[k + 1]), int(flat[k + 2])))

    def _marks_of(self, shard: int) -> deque[tuple[int, int, int]]:
        """``shard``'s marks, as the most recently read file's (the oldest file's dropped)."""
        marks = self._marks.pop(shard, None)
        self._marks[shard] = marks if marks is not None else deque(maxlen=MARKS_KEPT)
        while len(self._marks) > FILES_MARKED:
            del self._marks[next(iter(self._marks))]
        return self._marks[shard]

    async def samples(self, slc: Slice) -> AsyncGenerator[Any, None]:
        """The lines ``[skip, skip + take)`` of one file: raw, as ``{"__url__", "__key__"
        (``"line N"``), "line"}`` for the source's decode step to parse; with
        ``parse="arrow"`` parsed already, in blocks of about :data:`BLOCK_BYTES`."""
        url = self._urls[slc.shard]
        target = self._client.shown(url)
        attempts = Attempts(target, self._retry, self._client.redact.extended(url_secrets(url)))
        end = None if slc.take is None else slc.skip + slc.take
        declared = None if self._counts is None else self._counts[slc.shard]
        compression = compression_of(url, self._compression)
        marks = self._marks_of(slc.shard) if compression is None else None
        lines = LineRuns(compression, self._max_member, marks, slc.skip)
        pending = _Pending(target, self._block)  # outlives a broken stream's attempt
        pin: dict[str, Any] = {}
        while True:
            chunks = self._client.stream(url, lines.resume_at(), pin)
            try:
                async for chunk in chunks:
                    attempts.progressed()
                    async for sample in pending.taking(lines.feed(chunk), lines, slc.skip, end):
                        yield sample
                    if end is not None and lines.seen >= end:
                        return
                # and a last line without a newline
                async for sample in pending.taking(lines.finish(), lines, slc.skip, end, True):
                    yield sample
                _check_count(slc.shard, lines.seen, end, declared)
                return
            except Exception as exc:
                if isinstance(exc, ValueError):  # miscounted: not the stream's failure
                    raise
                await attempts.failed(exc)
                lines.restart()
            finally:
                await chunks.aclose()

    def __repr__(self) -> str:
        first = redact_url(self._urls[0])
        return f"JsonlSource(<{len(self._urls)} files: {first}, ...>, {self._client!r})"


def _check_count(shard: int, seen: int, end: int | None, declared: int | None) -> None:
    """Raises ValueError when a file that ended after ``seen`` lines held fewer than its
    slice reads (``end``) or other than its count (``declared``) says."""
    if (end is not None and seen < end) or (declared is not None and seen != declared):
        raise miscounted(shard, declared, seen)


def _parse_line(sample: dict[str, Any]) -> Any:
    """One line's JSON value. Raises ValueError naming the file and line."""
    try:
        return json.loads(sample["line"])
    except ValueError as exc:
        raise ValueError(f"{sample['__url__']}: {sample['__key__']} is not JSON: {exc}") from None


class _Pending:
    """A file's lines given and not yet yielded: one by one, or (``block`` > 0) parsed by
    pyarrow in blocks once they hold ``block`` bytes."""

    def __init__(self, target: str, block: int) -> None:
        self._target, self._block = target, block
        self._runs: list[Run] = []
        self._bytes = 0  # of the lines in _runs, a newline each

    def add(self, runs: list[Run], skip: int, end: int | None) -> None:
        """The lines of ``runs`` in ``[skip, end)``."""
        stop = end if end is not None else float("inf")
        for run in runs:
            if skip <= run.index and run.index + run.count <= stop:
                kept = [run]
            else:  # at the slice's edge: line by line
                kept = [Run(i, n, raw, 1) for i, n, raw in run.numbered() if skip <= i < stop]
            self._runs += kept
            self._bytes += sum(len(r.data) + 1 for r in kept)

    async def taking(
        self,
        pieces: Iterator[list[Run]],
        lines: LineRuns,
        skip: int,
        end: int | None,
        last: bool = False,
    ) -> AsyncGenerator[Any, None]:
        """What can be yielded of the lines of ``pieces`` in ``[skip, end)``, a piece at a
        time (the next piece is made once this one's lines are taken), all of it once
        ``lines`` reached ``end`` or after the last piece with ``last``."""
        for runs in pieces:
            self.add(runs, skip, end)
            done = end is not None and lines.seen >= end
            async for sample in self.ready(last=done):
                yield sample
            if done:
                return
        if last:
            async for sample in self.ready(last=True):
                yield sample

    async def ready(self, last: bool) -> AsyncGenerator[Any, None]:
        """What can be yielded now: every line, or each block once full, and with ``last``
        the rest."""
        if not self._block:
            runs, self._runs, self._bytes = self._runs, [], 0
            for run in runs:
                # each line cut out as it is taken (a newline left on, which JSON ignores)
                for number, raw in enumerate(io.BytesIO(run.data), run.number):
                    yield self._line(number, raw)
            return
        while self._runs and (self._bytes >= self._block or last):
            block = self._take_block()
            count = sum(run.count for run in block)
            data = b"\n".join(run.data for run in block)
            table = await asyncio.to_thread(_arrow_table, data, count)
            if table is not None:
                yield ArrowRows(table)
                continue
            for run in block:  # one by one, each error named by its line
                for _, number, raw in run.numbered():
                    yield self._line(number, raw)

    def _take_block(self) -> list[Run]:
        """The first lines holding ``block`` bytes or more (all, when fewer), taken off."""
        size, cut = 0, 0
        while cut < len(self._runs) and size < self._block:
            size += len(self._runs[cut].data) + 1
            cut += 1
        block, self._runs = self._runs[:cut], self._runs[cut:]
        over = size - self._block
        if over > 0:  # the last run reaches past the block: the lines past it stay
            head, rest = block[-1].split(len(block[-1].data) - over)
            if rest is not None:
                block[-1] = head
                self._runs.insert(0, rest)
                size -= len(rest.data) + 1
        self._bytes -= size
        return block

    def _line(self, number: int, raw: bytes) -> dict[str, Any]:
        """One line, raw, for the source's decode step to parse."""
        return {"__url__": self._target, "__key__": f"line {number}", "line": raw}


def _arrow_table(data: bytes, count: int) -> Any | None:
    """The ``count`` lines of ``data`` as one pyarrow table, one row per line, or None where
    pyarrow cannot read them so (then they are parsed one by one)."""
    import pyarrow as pa
    import pyarrow.json as paj

    for block_size in (1 << 20, len(data) + 1) if len(data) >= 1 << 20 else (1 << 20,):
        try:
            table = paj.read_json(
                io.BytesIO(data), read_options=paj.ReadOptions(block_size=block_size)
            )
        except pa.ArrowInvalid as exc:  # malformed, conflicting, not objects, or too long
            if "straddl" in str(exc):
                continue  # a line longer than a block: all in one block
            return None
        except Exception:  # pyarrow's other refusals: line by line, each error named
            return None
        return table if table.num_rows == count else None
    return None
