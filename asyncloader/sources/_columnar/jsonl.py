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
:data:`MARK_BYTES`, which line starts at which byte (a fact about the file, whatever was
delivered), and ``state_dict()`` carries the last :data:`MARKS_KEPT` marks of the last
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
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from asyncloader.sources._columnar.arrow_rows import ArrowRows
from asyncloader.sources._map import DEFAULT_MAX_OBJECT_SIZE
from asyncloader.sources._redact import redact_url, url_secrets
from asyncloader.sources._retry import Attempts, Permanent, Retry
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
#: A plain file's reading notes where the next line starts about every this many bytes.
MARK_BYTES = 1 << 20
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


class Inflate:
    """Decompresses a stream chunk by chunk, across concatenated members (gzip) or frames
    (zstd); ``None`` passes the bytes through."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self._new: Callable[[], Any] | None = None
        if kind == "gzip":
            self._new = lambda: zlib.decompressobj(wbits=47)  # gzip or zlib header
        elif kind == "zstd":
            try:
                import zstandard
            except ImportError as exc:
                raise ImportError(
                    "a .zst file needs zstandard: pip install 'asyncloader[zstd]'"
                ) from exc
            # 1 MiB out per call: a third less time than the default 128 KiB pieces joined.
            self._new = partial(zstandard.ZstdDecompressor().decompressobj, write_size=1 << 20)
        self._obj = self._new() if self._new is not None else None
        self._inside = False  # the current member or frame has had input and not ended

    def feed(self, chunk: bytes) -> bytes:
        if self._obj is None or self._new is None:
            return chunk
        out = []
        while chunk:
            try:
                out.append(self._obj.decompress(chunk))
            except Exception as exc:
                raise Permanent(f"corrupt {self.kind} data: {type(exc).__name__}: {exc}") from None
            self._inside = not self._obj.eof
            if self._inside:
                break
            chunk = self._obj.unused_data  # the next member or frame
            self._obj = self._new()
        return b"".join(out)

    def finish(self) -> None:
        """Raises Permanent when the stream ended inside a member or frame (truncated)."""
        if self._inside:
            raise Permanent(f"truncated {self.kind} data: the stream ended inside a frame")


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
                _note(marks, (int(flat[k]), int(flat[k + 1]), int(flat[k + 2])))

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
        lines = _Lines(compression, self._max_member, marks, slc.skip)
        pending = _Pending(target, self._block)  # outlives a broken stream's attempt
        pin: dict[str, Any] = {}
        while True:
            chunks = self._client.stream(url, lines.resume_at(), pin)
            try:
                async for chunk in chunks:
                    attempts.progressed()
                    pending.add(lines.feed(chunk), slc.skip, end)
                    async for sample in pending.ready(last=end is not None and lines.seen >= end):
                        yield sample
                    if end is not None and lines.seen >= end:
                        return
                pending.add(lines.finish(), slc.skip, end)  # a last line without a newline
                async for sample in pending.ready(last=True):
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
    """A file's lines given and not yet yielded: raw, one by one, or (``block`` > 0) parsed
    by pyarrow once they hold ``block`` bytes."""

    def __init__(self, target: str, block: int) -> None:
        self._target, self._block = target, block
        self._lines: list[tuple[int, bytes]] = []  # (line number, line)
        self._bytes = 0

    def add(self, given: list[tuple[int, int, bytes]], skip: int, end: int | None) -> None:
        """The lines of ``given`` in ``[skip, end)``."""
        stop = end if end is not None else float("inf")
        lines = [(n, raw) for i, n, raw in given if skip <= i < stop]
        self._lines += lines
        if self._block:
            self._bytes += sum(len(raw) for _, raw in lines)

    async def ready(self, last: bool) -> AsyncGenerator[Any, None]:
        """What can be yielded now: every line, or each block once full, and with ``last``
        the rest."""
        if not self._block:
            for number, raw in self._lines:
                yield {"__url__": self._target, "__key__": f"line {number}", "line": raw}
            self._lines = []
            return
        while self._lines and (self._bytes >= self._block or last):
            size, cut = 0, 0
            while cut < len(self._lines) and size < self._block:
                size += len(self._lines[cut][1])
                cut += 1
            lines, self._lines, self._bytes = (
                self._lines[:cut],
                self._lines[cut:],
                self._bytes - size,
            )
            table = await asyncio.to_thread(_arrow_table, [raw for _, raw in lines])
            if table is not None:
                yield ArrowRows(table)
                continue
            for number, raw in lines:  # one by one, each error named by its line
                yield {"__url__": self._target, "__key__": f"line {number}", "line": raw}


def _arrow_table(lines: list[bytes]) -> Any | None:
    """``lines`` as one pyarrow table, one row per line, or None where pyarrow cannot read
    them so (then they are parsed one by one)."""
    import pyarrow.json as paj

    longest = max(map(len, lines))
    options = paj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2))
    try:
        table = paj.read_json(io.BytesIO(b"\n".join(lines)), read_options=options)
    except Exception:  # ArrowInvalid and kin: malformed, conflicting or not objects
        return None
    return table if table.num_rows == len(lines) else None


def _note(marks: deque[tuple[int, int, int]], mark: tuple[int, int, int]) -> None:
    """Adds ``mark`` unless it is not past the last one (a file read again, a loaded state)."""
    if not marks or marks[-1][0] < mark[0]:
        marks.append(mark)


class _Lines:
    """Splits a file's (decompressed) bytes into numbered lines, blank lines left out, and
    knows where a broken stream resumes.

    ``seen`` counts the non-blank lines given; ``number`` the lines read (1-based). A plain
    file's reading notes in ``marks`` where its next line starts about every
    :data:`MARK_BYTES`, and starts at the last mark at or before its line ``skip``."""

    def __init__(
        self,
        compression: str | None,
        limit: int | None,
        marks: deque[tuple[int, int, int]] | None = None,
        skip: int = 0,
    ) -> None:
        self._compression, self._limit, self._marks = compression, limit, marks
        index, number, offset = max(
            (m for m in marks or () if m[0] <= skip), default=(0, 1, 0), key=lambda m: m[0]
        )
        self.seen = index  # non-blank lines given (or read past by a mark), over all attempts
        self._given = index  # ... by the current attempt, when it replays from the start
        self._number = number - 1  # lines read by the current attempt
        self._offset = offset  # a plain file's byte after the last whole line
        self._next_mark = offset + MARK_BYTES
        self._inflate = Inflate(compression)
        self._rest: list[bytes] = []  # the pieces of the line not ended yet
        self._pending = 0  # their bytes

    def resume_at(self) -> int:
        return self._offset if self._compression is None else 0

    def restart(self) -> None:
        """A broken stream: a plain file continues after its last whole line, a compressed
        one replays from its start, past the lines already given."""
        self._rest, self._pending = [], 0
        if self._compression is not None:
            self._inflate = Inflate(self._compression)
            self._given, self._number = 0, 0

    def feed(self, chunk: bytes) -> list[tuple[int, int, bytes]]:
        """``(index, number, line)`` of the whole lines ``chunk`` completes, not given
        before: ``index`` counts the file's non-blank lines from 0, ``number`` all its
        lines from 1."""
        piece = self._inflate.feed(chunk)
        if b"\n" in piece:
            parts = b"".join([*self._rest, piece]).split(b"\n")
            last = parts.pop()
            self._rest, self._pending = [last], 0
        else:  # a long line: its pieces are joined once, at its end
            parts, last = [], piece
            self._rest.append(piece)
        self._pending += len(last)  # of the line not ended yet
        if self._limit is not None and self._pending > self._limit:
            raise Permanent(f"a line over max_object_size={self._limit} bytes")
        return self._take(parts)

    def finish(self) -> list[tuple[int, int, bytes]]:
        """The last line, when the file does not end with a newline."""
        self._inflate.finish()
        rest = b"".join(self._rest)
        self._rest, self._pending, self._marks = [], 0, None  # no line starts past the end
        return self._take([rest]) if rest.strip() else []

    def _take(self, parts: list[bytes]) -> list[tuple[int, int, bytes]]:
        """The lines of ``parts`` not given before, noting a mark where one is due."""
        out = []
        for raw in parts:
            self._number += 1
            self._offset += len(raw) + 1
            if raw.strip():
                self._given += 1
                if self._given > self.seen:  # not given by an earlier attempt
                    out.append((self.seen, self._number, raw))
                    self.seen += 1
            if self._offset >= self._next_mark and self._marks is not None:
                _note(self._marks, (self._given, self._number + 1, self._offset))
                self._next_mark = self._offset + MARK_BYTES
        return out
