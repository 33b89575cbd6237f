"""LineRuns: a file's bytes as runs of numbered lines. Over random files (blank, CRLF and
long lines, a last line without a newline) cut into random chunks, the lines, their indices
and numbers, and the marks a plain file notes are those of a line-by-line reading; a run
splits at a line's end."""

from __future__ import annotations

import gzip
import random
from collections import deque

import pytest
import zstandard

from asyncloader.sources._columnar import line_runs
from asyncloader.sources._columnar.line_runs import LineRuns, Run

MARK = 64
COMPRESS = {
    None: lambda data: data,
    "gzip": gzip.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def random_file(rng: random.Random) -> bytes:
    lines = []
    for _ in range(rng.randrange(0, 60)):
        kind = rng.random()
        if kind < 0.08:
            lines.append(rng.choice(["", "  ", "\r", "\t \x0b"]))  # blank
        elif kind < 0.12:
            lines.append(" " + '{"lead": 1}')  # leading space, not blank
        else:
            lines.append('{"x": "' + "y" * rng.randrange(0, 120) + '"}' + rng.choice(["", "\r"]))
    data = "\n".join(lines)
    return (data + rng.choice(["", "\n"])).encode()


def by_lines(data: bytes) -> tuple[list[tuple[int, int, bytes]], list[tuple[int, int, int]]]:
    """The reference: ``(index, number, line)`` of each non-blank line, and the marks noted
    after each line whose end reaches the next mark (the last line noted only when it ends
    with a newline: no line starts past the file's end)."""
    lines, marks, index, offset, next_mark = [], [], 0, 0, MARK
    parts = data.split(b"\n")
    for number, raw in enumerate(parts, 1):
        if raw.strip():
            lines.append((index, number, raw))
            index += 1
        offset += len(raw) + 1
        if number < len(parts) and offset >= next_mark:
            marks.append((index, number + 1, offset))
            next_mark = offset + MARK
    return lines, marks


def read(
    data: bytes, rng: random.Random, compression: str | None = None
) -> tuple[list[Run], list[tuple[int, int, int]]]:
    marks: deque[tuple[int, int, int]] = deque()
    reader, runs, at = LineRuns(compression, None, marks), [], 0
    data = COMPRESS[compression](data)
    while at < len(data):
        step = rng.choice([1, 7, 50, 300, 5000])
        runs += [r for piece in reader.feed(data[at : at + step]) for r in piece]
        at += step
    return runs + [r for piece in reader.finish() for r in piece], list(marks)


@pytest.mark.parametrize("seed", range(300))
def test_runs_are_the_lines_with_their_numbers_and_marks(monkeypatch, seed):
    monkeypatch.setattr(line_runs, "MARK_BYTES", MARK)
    rng = random.Random(seed)
    data = random_file(rng)
    runs, marks = read(data, rng)
    want_lines, want_marks = by_lines(data)
    assert [line for run in runs for line in run.numbered()] == want_lines
    assert all(run.count == len(run.data.split(b"\n")) for run in runs)
    assert marks == want_marks


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
@pytest.mark.parametrize("seed", range(100))
def test_compressed_runs_are_the_lines_decompressed_in_pieces(monkeypatch, seed, compression):
    """A compressed file's lines, decompressed once its held input reaches INFLATE_BYTES
    (and at the end); a compressed file notes no marks."""
    monkeypatch.setattr(line_runs, "INFLATE_BYTES", 40)
    rng = random.Random(seed)
    data = random_file(rng)
    runs, marks = read(data, rng, compression)
    assert [line for run in runs for line in run.numbered()] == by_lines(data)[0]
    assert marks == []


def test_whole_lines_of_one_chunk_are_one_run():
    (runs,) = LineRuns(None, None).feed(b'{"a": 1}\n{"a": 2}\r\n{"a": 3}\n{"a": 4')
    assert runs == [Run(0, 1, b'{"a": 1}\n{"a": 2}\r\n{"a": 3}', 3)]


def test_a_run_splits_after_the_line_that_reaches_the_size():
    run = Run(5, 9, b"aa\nbbbb\ncc", 3)
    assert run.split(0) == (Run(5, 9, b"aa", 1), Run(6, 10, b"bbbb\ncc", 2))
    assert run.split(3) == (Run(5, 9, b"aa\nbbbb", 2), Run(7, 11, b"cc", 1))
    assert run.split(8) == (run, None)
