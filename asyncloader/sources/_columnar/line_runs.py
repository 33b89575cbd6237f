"""A JSON Lines file's bytes, decompressed as they stream, as runs of numbered lines.

A run is consecutive non-blank lines kept as the bytes they were read in (joined by
newlines), with the index and number of its first line: a block parser reads it as is, and
nothing is made per line until a line is wanted on its own. Where a piece of the file holds
a blank line, or replays lines already given, its lines come one run each.

A compressed file is decompressed in pieces made as they are asked for (:class:`Inflate`),
so what is held stays bounded however far the file decompresses.
"""

from __future__ import annotations

import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from asyncloader.sources._retry import Permanent

#: A plain file's reading notes where the next line starts about every this many bytes.
MARK_BYTES = 1 << 20
#: A compressed stream is decompressed in pieces of at least this much of its input: several
#: zstd streams decompressed at once in 64 KiB pieces (files read side by side) take about
#: three times as long as one at a time, each evicting the others' window from the cache.
INFLATE_BYTES = 1 << 20
#: Decompressed bytes are handed on in pieces of about this many, each split into lines
#: (and checked against the line limit) before the next is made.
OUT_BYTES = 1 << 20
#: The most zstd input decompressed per call. A call returns all it makes, and a zstd block of
#: 4 bytes can make 128 KiB (a run), so this bounds a call's output at about 32 MiB whatever a
#: file holds (32 MiB measured for 1 KiB of a 400 MB run). The step starts at
#: :data:`ZSTD_FIRST_STEP` and halves while calls make more than :data:`OUT_BYTES`, doubling
#: back while they make under half of it.
ZSTD_STEP = 1 << 10
ZSTD_FIRST_STEP = 64
#: A newline followed by what ``bytes.strip`` strips: where a blank line may start.
_SPACE_AFTER_NEWLINE = re.compile(rb"\n[ \t\n\r\x0b\x0c]")


class Inflate:
    """Decompresses a stream, across concatenated members (gzip) or frames (zstd), once it
    holds :data:`INFLATE_BYTES` of input (the rest at :meth:`finish`), into pieces of about
    :data:`OUT_BYTES` made one at a time as they are asked for: however far a file
    compresses, no more than a piece and a call's output is held. ``None`` passes the bytes
    through as they come."""

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
            self._new = zstandard.ZstdDecompressor().decompressobj
        self._obj: Any = self._new() if self._new is not None else None
        self._inside = False  # the current member or frame has had input and not ended
        self._input: list[bytes] = []  # not decompressed yet
        self._held = 0  # their bytes
        self._step = ZSTD_FIRST_STEP  # zstd input per call

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """What ``chunk`` and the input held before it decompress to, once they hold
        :data:`INFLATE_BYTES`; else nothing yet."""
        if self._obj is None:
            yield chunk
            return
        self._input.append(chunk)
        self._held += len(chunk)
        if self._held >= INFLATE_BYTES:
            yield from self._pieces()

    def finish(self) -> Iterator[bytes]:
        """What the input held decompresses to. Raises Permanent when the stream ended
        inside a member or frame (truncated)."""
        yield from self._pieces()
        if self._inside:
            raise Permanent(f"truncated {self.kind} data: the stream ended inside a frame")

    def _pieces(self) -> Iterator[bytes]:
        """The input held, decompressed, in pieces of about :data:`OUT_BYTES`, each made
        when asked for."""
        data = b"".join(self._input)
        self._input, self._held = [], 0
        out: list[bytes] = []
        size = 0
        for part in self._parts(data):
            out.append(part)
            size += len(part)
            if size >= OUT_BYTES:
                yield b"".join(out)
                out, size = [], 0
        if out:
            yield b"".join(out)

    def _parts(self, data: bytes) -> Iterator[bytes]:
        """``data`` decompressed, a call's output at a time: at most :data:`OUT_BYTES`
        (gzip), or what at most :data:`ZSTD_STEP` of input makes (zstd)."""
        if self._obj is None or not data:
            return
        try:
            yield from (self._gzip_parts if self.kind == "gzip" else self._zstd_parts)(data)
        except Permanent:
            raise
        except Exception as exc:
            raise Permanent(f"corrupt {self.kind} data: {type(exc).__name__}: {exc}") from None

    def _gzip_parts(self, data: bytes) -> Iterator[bytes]:
        while True:
            obj = self._obj
            part = obj.decompress(data, OUT_BYTES)
            data = self._ended(obj, obj.unconsumed_tail)
            if part:
                yield part
            if not data and len(part) < OUT_BYTES:  # else zlib may hold more output
                return

    def _zstd_parts(self, data: bytes) -> Iterator[bytes]:
        view, at = memoryview(data), 0  # slices of a view: the rest is never copied
        while at < len(view):
            obj, step = self._obj, self._step
            part = obj.decompress(view[at : at + step])
            self._step = _next_step(step, len(part))
            at += step
            self._inside = not obj.eof
            if obj.eof:
                view, at = memoryview(self._ended(obj, bytes(view[at:]))), 0
            if part:
                yield part

    def _ended(self, obj: Any, rest: bytes) -> bytes:
        """The input still to decompress after a call of ``obj`` that left ``rest`` of what
        it was given: when its member or frame ended, what it read past the end first (the
        next one's start), for a new decompressor."""
        self._inside = not obj.eof
        if not obj.eof or self._new is None:
            return rest
        self._obj = self._new()
        return bytes(obj.unused_data) + rest


def _next_step(step: int, made: int) -> int:
    """The zstd input for the next call, after ``step`` bytes made ``made``: halved while
    over :data:`OUT_BYTES`, doubled while under half of it, within 16 and
    :data:`ZSTD_STEP`."""
    if made > OUT_BYTES:
        return max(16, step // 2)
    return min(ZSTD_STEP, step * 2) if made < OUT_BYTES // 2 else step


@dataclass(frozen=True, slots=True)
class Run:
    """``count`` consecutive non-blank lines of a file, joined by newlines in ``data``;
    ``index`` is the first's among the file's non-blank lines (from 0), ``number`` among
    all its lines (from 1)."""

    index: int
    number: int
    data: bytes
    count: int

    def numbered(self) -> Iterator[tuple[int, int, bytes]]:
        """``(index, number, line)`` of each line, each cut out as it is asked for."""
        data, start = self.data, 0
        for k in range(self.count):
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            yield self.index + k, self.number + k, data[start:end]
            start = end + 1

    def split(self, size: int) -> tuple[Run, Run | None]:
        """The lines up to the first that ends at or past byte ``size`` of ``data``, and the
        rest (None when none is left)."""
        cut = self.data.find(b"\n", size)
        if cut < 0:
            return self, None
        head = self.data.count(b"\n", 0, cut) + 1
        rest = Run(self.index + head, self.number + head, self.data[cut + 1 :], self.count - head)
        return Run(self.index, self.number, self.data[:cut], head), rest


def _may_hold_blank(data: bytes) -> bool:
    """Whether a line of ``data`` (lines joined by newlines) may be blank: one starts with
    what ``bytes.strip`` strips, or is empty."""
    return (
        not data
        or data[:1].isspace()
        or data.endswith(b"\n")
        or _SPACE_AFTER_NEWLINE.search(data) is not None
    )


def note(marks: deque[tuple[int, int, int]], mark: tuple[int, int, int]) -> None:
    """Adds ``mark`` unless it is not past the last one (a file read again, a loaded state)."""
    if not marks or marks[-1][0] < mark[0]:
        marks.append(mark)


class LineRuns:
    """Splits a file's (decompressed) bytes into runs of numbered lines, blank lines left
    out, and knows where a broken stream resumes.

    ``seen`` counts the non-blank lines given; ``number`` the lines read (1-based). A plain
    file's reading notes in ``marks`` where its next line starts about every
    :data:`MARK_BYTES` (``(index, number, offset)``), and starts at the last mark at or
    before its line ``skip``."""

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

    def feed(self, chunk: bytes) -> Iterator[list[Run]]:
        """The runs of whole lines ``chunk`` completes, not given before: a list per piece
        decompressed, each made when asked for."""
        for piece in self._inflate.feed(chunk):
            yield self._lines_of(piece)

    def finish(self) -> Iterator[list[Run]]:
        """The lines the input held completes, and the last line, when the file does not end
        with a newline."""
        for piece in self._inflate.finish():
            yield self._lines_of(piece)
        rest = b"".join(self._rest)
        self._rest, self._pending, self._marks = [], 0, None  # no line starts past the end
        if rest.strip():
            yield self._take([rest])

    def _lines_of(self, piece: bytes) -> list[Run]:
        """The runs of whole lines ``piece`` (decompressed) completes."""
        if not piece:
            return []
        end = piece.rfind(b"\n")
        data = None
        if end < 0:  # a long line: its pieces are joined once, at its end
            self._rest.append(piece)
            self._pending += len(piece)
        else:
            data = b"".join([*self._rest, piece[:end]]) if self._rest else piece[:end]
            last = piece[end + 1 :]
            self._rest, self._pending = [last], len(last)
        if self._limit is not None and self._pending > self._limit:
            raise Permanent(f"a line over max_object_size={self._limit} bytes")
        return [] if data is None else self._runs(data)

    def _runs(self, data: bytes) -> list[Run]:
        """The lines of ``data`` (whole lines joined by newlines) not given before: one run
        where none may be blank and none was given before, else a run per line."""
        if self._given < self.seen or _may_hold_blank(data):  # replaying, or blank lines
            return self._take(data.split(b"\n"))
        count = data.count(b"\n") + 1
        run, start = Run(self.seen, self._number + 1, data, count), self._offset
        self._number += count
        self._given += count
        self.seen += count
        self._offset += len(data) + 1
        while self._marks is not None and self._offset >= self._next_mark:
            # the first line of the run that ends at or past the mark
            end = data.find(b"\n", max(0, self._next_mark - start - 1))
            end = len(data) if end < 0 else end
            lines = data.count(b"\n", 0, end) + 1
            note(self._marks, (run.index + lines, run.number + lines, start + end + 1))
            self._next_mark = start + end + 1 + MARK_BYTES
        return [run]

    def _take(self, parts: list[bytes]) -> list[Run]:
        """The lines of ``parts`` not given before, a run each, noting a mark where one is
        due."""
        out = []
        for raw in parts:
            self._number += 1
            self._offset += len(raw) + 1
            if raw.strip():
                self._given += 1
                if self._given > self.seen:  # not given by an earlier attempt
                    out.append(Run(self.seen, self._number, raw, 1))
                    self.seen += 1
            if self._offset >= self._next_mark and self._marks is not None:
                note(self._marks, (self._given, self._number + 1, self._offset))
                self._next_mark = self._offset + MARK_BYTES
        return out
