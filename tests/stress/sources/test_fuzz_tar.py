"""Fuzzing the tar reader and the sample grouping: archives generated from a spec
(hypothesis), a byte-level mutator over real shards (written by Python's tarfile and by GNU
tar), and shards end to end through ShardedSource and AsyncLoader with both ``on_error``.

Each case is read by ``ShardedSource.samples`` (the reader and the grouping) from memory, in
chunks of fuzzed sizes, under a 1 s ``asyncio.wait_for`` (past it, the case is read again
with 60 s and counted: a hang times out again, a loaded machine does not) and a 1 s CPU
budget (``budget``: a loop that never awaits is caught too). Its outcome must be one of:

- delivered: exactly the expected samples. Generated: the spec's. Mutated: what Python's
  tarfile reads from the same bytes (its regular files, grouped by ``reference`` below,
  written apart from the code under test); tar holds no checksum of member data, so a
  flipped data byte is delivered as tarfile reads it, never otherwise;
- a FetchError naming the shard and a byte offset inside it: permanent (one attempt), or a
  truncation (retried, so it ends where the retry policy does: attempts=1 here); the
  samples before it are a prefix of the expected ones.

Anything else fails: another exception, a hang, a sample that differs. The number of cases
is ``ASYNCLOADER_FUZZ_CASES`` (default 10,000: CI; ``make fuzz``: 200,000); the outcome
counts are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import random
import re
import shutil
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import Retry, ShardedSource
from asyncloader.sources._redact import Redactor
from asyncloader.sources._sharded import tar as _tar
from asyncloader.sources._sharded.shardplan import Slice
from tests.helpers.tars import (
    BLOCK,
    END,
    base256,
    budget,
    checksummed,
    header,
    long_name,
    member,
    no_spin,
    octal,
    pax,
)

CASES = int(os.environ.get("ASYNCLOADER_FUZZ_CASES", "10000"))
GENERATED = max(1000, CASES // 10)
MUTATED = CASES - GENERATED
END_TO_END = max(240, CASES // 100)  # shards, 8 to a loader
MAX_FIELDS = 4  # the cap, lowered so that cases reach it
URL = "fuzz.tar"
ONCE = Retry(attempts=1)
OFFSET = re.compile(r"offset (\d+)")
Sample = dict[str, Any]


# -- the oracle ------------------------------------------------------------------------------


def reference(members: list[tuple[str, bytes, int]], closed_only: bool) -> tuple[list, int | None]:
    """WebDataset's grouping written out plainly: ``(samples, offset of the member at
    fault)``. A sample is delivered once a member of another key (or the archive's end,
    unless ``closed_only``) closes it; a repeated field, a dunder field or a field past
    MAX_FIELDS stops it, as the code under test must."""
    out: list[tuple[str, dict[str, bytes]]] = []
    key: str | None = None
    fields: dict[str, bytes] = {}
    for name, data, start in members:
        slash = name.rfind("/") + 1
        base, dot, ext = name[slash:].partition(".")
        this, name_field = name[:slash] + base, ext if dot else ""
        if key is not None and this != key:
            out.append((key, fields))
            key, fields = None, {}
        if refused(name_field, fields):
            return out, start
        key, fields[name_field] = this, data
    if key is not None and not closed_only:
        out.append((key, fields))
    return out, None


def refused(name_field: str, fields: dict[str, bytes]) -> bool:
    """A field that the sample already has, a dunder name, or one past MAX_FIELDS."""
    dunder = name_field.startswith("__") and name_field.endswith("__")
    return name_field in fields or dunder or len(fields) >= MAX_FIELDS


def as_pairs(samples: list[Sample]) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (s["__key__"], {k: v for k, v in s.items() if k not in ("__key__", "__url__")})
        for s in samples
    ]


def tarfile_members(data: bytes) -> list[tuple[str, bytes, int]]:
    """The regular files Python's tarfile reads from ``data`` (up to where it stops), under a
    CPU budget of 1 s."""
    out = []
    failures = (tarfile.TarError, EOFError, ValueError)
    with (
        budget(1.0),
        contextlib.suppress(*failures),
        tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar,
    ):
        for info in tar:
            if info.isreg():
                extracted = tar.extractfile(info)
                assert extracted is not None
                body = extracted.read()
                if len(body) != info.size:
                    break
                out.append((info.name, body, info.offset))
    return out


# -- running a case --------------------------------------------------------------------------


class Memory:
    """A client over bytes in memory: chunks of fuzzed sizes, an await between some."""

    redact = Redactor()

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.rng = random.Random(0)

    def shown(self, target: str) -> str:
        return target

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        raise AssertionError("ShardedSource streams")

    async def stream(self, target: str, start: int, pin: dict[str, Any]) -> Any:
        data, pos, rng = self.objects[target], start, self.rng
        tiny = rng.random() < 0.02
        while pos < len(data):
            if tiny:
                n = rng.randint(0, 40)
            else:
                n = rng.choice((rng.randint(1, 2048), BLOCK, BLOCK + 1, 4096, len(data)))
            if rng.random() < 0.25:  # not at every chunk: the loop's turns are the cost
                await asyncio.sleep(0)
            yield data[pos : pos + n]
            pos += n

    async def aclose(self) -> None:
        pass


@dataclass
class Outcome:
    """A case's samples, and the FetchError that ended it with its offset and kind."""

    delivered: list[tuple[str, dict[str, bytes]]]
    error: FetchError | None = None
    offset: int | None = None
    kind: str = "delivered"


@dataclass
class Runner:
    """Reads cases through ``ShardedSource.samples`` on one loop; counts outcomes, times."""

    loop: asyncio.AbstractEventLoop
    memory: Memory = field(default_factory=Memory)
    counts: Counter = field(default_factory=Counter)
    slowest: float = 0.0  # seconds of CPU
    slowest_wall: float = 0.0

    def __post_init__(self) -> None:
        self.source = ShardedSource([URL], retry=ONCE)
        self.source._client = self.memory  # type: ignore[assignment]

    def read(self, data: bytes, seed: int) -> Outcome:
        """The outcome of reading ``data`` within 1 s of CPU and 1 s of wall time. Past 1 s
        of wall time the case is read again with 60 s: an await that never ends times out
        again, a machine too loaded to run it in 1 s does not (and is counted)."""
        began, began_cpu = time.perf_counter(), time.process_time()
        try:
            outcome = self._read(data, seed, 1.0)
        except TimeoutError:
            self.counts["read again, 1 s of wall time passed"] += 1
            outcome = self._read(data, seed, 60.0)
        self.slowest = max(self.slowest, time.process_time() - began_cpu)
        self.slowest_wall = max(self.slowest_wall, time.perf_counter() - began)
        return outcome

    def _read(self, data: bytes, seed: int, deadline: float) -> Outcome:
        self.memory.objects[URL] = data
        self.memory.rng.seed(seed)
        out: list[Sample] = []

        async def collect() -> None:
            async with contextlib.aclosing(self.source.samples(Slice(0, 0, None))) as it:
                async for sample in it:
                    out.append(sample)

        try:
            with budget(1.0):
                self.loop.run_until_complete(asyncio.wait_for(collect(), deadline))
            outcome = Outcome(as_pairs(out))
        except FetchError as exc:
            outcome = Outcome(as_pairs(out), exc, *checked(exc, data))
        assert all(s["__url__"] == URL for s in out)
        return outcome


def checked(error: FetchError, data: bytes) -> tuple[int, str]:
    """``(offset, kind)`` of a FetchError, checked: it names the shard and an offset within
    it, and is permanent (one attempt) or a truncation that the retry policy ended."""
    assert error.target == URL, error
    found = OFFSET.search(error.cause)
    assert found and 0 <= int(found[1]) <= len(data), error
    if "truncated tar" in error.cause:
        assert "attempts=1" in error.reason, error
        return int(found[1]), "truncated"
    assert error.attempts == 1 and "permanent" in error.reason, error
    return int(found[1]), "malformed"


def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-past warnings (one per kind and shard read, tested elsewhere) off."""
    monkeypatch.setattr(logging.getLogger("asyncloader.sources"), "disabled", True)


@contextlib.contextmanager
def fuzzing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    """A runner on a fresh loop, the field cap lowered; each case, and each read of tarfile,
    under a CPU budget of its own."""
    monkeypatch.setattr(_tar, "MAX_FIELDS", MAX_FIELDS)
    quiet(monkeypatch)
    loop = asyncio.new_event_loop()
    try:
        with no_spin(None):
            yield Runner(loop)
    finally:
        loop.close()


def report(name: str, runner: Runner) -> None:
    total = sum(runner.counts.values())
    print(
        f"\n{name}: {total} cases, {dict(sorted(runner.counts.items()))}; slowest case: "
        f"{runner.slowest * 1000:.0f} ms of CPU, {runner.slowest_wall * 1000:.0f} ms of wall time"
    )


# -- generated archives ----------------------------------------------------------------------


@dataclass
class Built:
    """An archive built member by member: its bytes, the regular files in it (name, data,
    offset of its first header), and what reading it must give."""

    parts: list[bytes] = field(default_factory=list)
    regular: list[tuple[str, bytes, int, int]] = field(default_factory=list)  # and its end
    fault: int | None = None  # offset of a malformed header, if any
    cut: int | None = None  # bytes kept, if truncated

    @property
    def offset(self) -> int:
        return sum(map(len, self.parts))

    def add(self, *parts: bytes) -> int:
        at = self.offset
        self.parts.extend(parts)
        return at

    def bytes(self) -> bytes:
        data = b"".join(self.parts) + END
        return data if self.cut is None else data[: self.cut]


KIND = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE])
SEGMENT = st.text("abcxyz019_-é€", min_size=1, max_size=12)
EXTRA = [b"dir", b"symlink", b"link", b"fifo", b"char", b"unknown", b"global", b"linkname"]
DEFECTS = ["repeat", "reserved", "many", "pax", "negative", "data-in-dir", "truncate"]


def encode(name: str, data: bytes, kind: bytes, how: str) -> list[bytes]:
    """A regular member as ustar (name split into prefix), GNU (``L``) or pax (``path``)."""
    if how == "ustar":
        with contextlib.suppress(ValueError):
            return [member(name, data, kind)]
        how = "pax"
    if how == "gnu":
        return [long_name(name.encode() + b"\0"), member("././@LongLink-member", data, kind)]
    return [pax({"path": name, "mtime": "1.5"}), member("PaxHeaders/placeholder", data, kind)]


def extra(built: Built, what: bytes, n: int) -> None:
    """A member that is not a regular file (read past), or harmless metadata."""
    types = {b"dir": tarfile.DIRTYPE, b"symlink": tarfile.SYMTYPE, b"link": tarfile.LNKTYPE}
    types |= {b"fifo": tarfile.FIFOTYPE, b"char": tarfile.CHRTYPE}
    if what in types:
        built.add(header(f"x{n}/" if what == b"dir" else f"x{n}.lnk", types[what], 0))
    elif what == b"unknown":  # an unknown type's data is skipped, as tarfile does
        built.add(member(f"volume{n}", b"V" * (n % 700), b"V"))
    elif what == b"global":
        built.add(pax({"comment": f"built {n}"}, tarfile.XGLTYPE))
    else:
        built.add(member("././@LongLink", b"t" * 120 + b"\0", tarfile.GNUTYPE_LONGLINK))
        built.add(header(f"s{n}.lnk", tarfile.SYMTYPE, 0))


def defect(built: Built, which: str, last: tuple[str, str] | None, draw: Any) -> None:
    """Adds a flaw whose outcome is known: a grouping error or a malformed header (both at
    a known offset), or a cut."""
    if which in ("repeat", "reserved", "many") and last is not None:
        key, ext = last
        names = {"repeat": [f"{key}.{ext}" if ext else key]}
        names["reserved"] = [f"{key}.__{draw(SEGMENT)}__"]
        names["many"] = [f"{key}.m{i}" for i in range(MAX_FIELDS)]
        for name in names[which]:
            at = built.add(*encode(name, b"bad", tarfile.REGTYPE, "ustar"))
            built.regular.append((name, b"bad", at, built.offset))
    elif which == "pax":
        bad = draw(st.sampled_from([b"0 a=b\n", b"3 a=b\n", b"99 a=b\n", b"x a=b\n", b"6 ab\n\n"]))
        built.fault = built.add(pax(bad), member("after.txt", b"after"))
    elif which == "negative":
        built.fault = built.add(header("neg.txt", size=base256(-draw(st.integers(1, 10**6)))))
    elif which == "data-in-dir":
        built.fault = built.add(member("d", b"data", tarfile.DIRTYPE))
    elif which == "truncate":
        built.cut = draw(st.integers(0, built.offset + BLOCK - 1))


@st.composite
def archives(draw: Any) -> Built:
    built, last = Built(), None
    how = draw(st.sampled_from(["ustar", "gnu", "pax"]))
    flaw = draw(st.sampled_from(DEFECTS)) if draw(st.integers(0, 3)) == 0 else None
    for i in range(draw(st.integers(0, 5))):
        key = "/".join(draw(st.lists(SEGMENT, min_size=1, max_size=3)))
        key += "k" * draw(st.sampled_from([0, 0, 90, 200]))  # long names
        exts = draw(
            st.lists(
                st.sampled_from(["jpg", "txt", "seg.png", "cls", ""]),
                unique=True,
                min_size=1,
                max_size=MAX_FIELDS,
            )
        )
        for ext in exts:
            if draw(st.integers(0, 5)) == 0:
                extra(built, draw(st.sampled_from(EXTRA)), i)
            size = draw(st.sampled_from([0, 1, 5, 100, 511, 512, 513, 1000]))
            data = bytes([draw(st.integers(0, 255))]) * size
            name = f"{key}.{ext}" if ext else key
            at = built.add(*encode(name, data, draw(KIND), how))
            built.regular.append((name, data, at, built.offset))
            last = (key, ext)
    if flaw is not None:
        defect(built, flaw, last, draw)
    return built


def expected(built: Built) -> tuple[list, int | None, str]:
    """``(samples, offset, kind)`` that reading ``built`` must give: its samples; or, with a
    fault (the first of a grouping error and a malformed header), those it closed before
    it; or, cut short, those closed by the members whose bytes all survive."""
    if built.cut is not None:
        whole = [m[:3] for m in built.regular if m[3] <= built.cut]
        samples, fault = reference(whole, closed_only=True)
        return samples, fault, "truncated" if fault is None else "malformed"
    members = [m[:3] for m in built.regular]
    samples, fault = reference(members, closed_only=built.fault is not None)
    if fault is not None:
        return samples, fault, "malformed"
    return samples, built.fault, "delivered" if built.fault is None else "malformed"


def test_generated_archives_give_their_samples_or_fail_where_they_are_malformed(monkeypatch):
    """Archives with long names (ustar prefix, GNU, pax), every regular type, links,
    directories, devices, unknown types, global headers; a quarter with one flaw."""
    with fuzzing(monkeypatch) as runner:

        @settings(
            max_examples=GENERATED,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(archives(), st.integers(0, 2**32))
        def case(built: Built, seed: int) -> None:
            data = built.bytes()
            got = runner.read(data, seed)
            samples, offset, kind = expected(built)
            runner.counts[label(got)] += 1
            assert got.kind == kind, (got, kind)
            assert got.delivered == samples
            if kind == "malformed":
                assert got.offset == offset, (got.error, offset)

        case()
    report("generated", runner)
    assert sum(runner.counts.values()) >= GENERATED


# -- mutated real shards ---------------------------------------------------------------------


def tree(root: Path, long: bool) -> None:
    """Files of WebDataset samples under ``root/d``: regular files, a hard link, a symbolic
    link, an empty directory; with ``long``, a directory name past 100 bytes."""
    base = root / "d" / ("n" * 110 if long else "n")
    base.mkdir(parents=True)
    (root / "d" / "empty").mkdir()
    rng = random.Random(7)
    for i in range(6):
        for ext, size in (("jpg", rng.choice([0, 3, 511, 512, 513, 1500])), ("cls", 2)):
            (base / f"s{i:04d}.{ext}").write_bytes(rng.randbytes(size))
    os.link(base / "s0000.jpg", base / "s0006.jpg")
    os.symlink("s0001.jpg", base / "s0007.jpg")


def gnu_tar(root: Path, fmt: str) -> bytes:
    args = ["tar", f"--format={fmt}", "--sort=name", "--mtime=@0", "--owner=0", "--group=0"]
    args += ["--numeric-owner", "-cf", "-", "-C", str(root), "d"]
    if fmt != "ustar":  # records of one block: no padding to 10 KiB, which mutations miss
        args[1:1] = ["--blocking-factor=1"]
    if fmt == "pax":
        args[1:1] = ["--pax-option=delete=atime,delete=ctime,exthdr.name=%d/PaxHeaders/%f"]
    return subprocess.run(args, check=True, capture_output=True, timeout=60).stdout


def python_tar(fmt: int, rng: random.Random) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for i in range(8):
            key = ("p" * 120 + "/" if fmt != tarfile.USTAR_FORMAT and i % 3 == 0 else "") + f"k{i}"
            for ext in ("jpg", "json"):
                info = tarfile.TarInfo(f"{key}.{ext}")
                data = rng.randbytes(rng.choice([0, 1, 100, 511, 512, 513, 2000]))
                info.size, info.type = len(data), rng.choice([tarfile.REGTYPE, tarfile.CONTTYPE])
                tar.addfile(info, io.BytesIO(data))
            if i == 4:
                for kind in (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info = tarfile.TarInfo(f"x{i}")
                    info.type, info.linkname = kind, "k0.jpg"
                    tar.addfile(info)
    return out.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Real shards: Python's tarfile (ustar, GNU, pax) and, where installed, GNU tar (gnu,
    oldgnu, pax, ustar, v7)."""
    rng = random.Random(3)
    shards = [
        python_tar(f, rng) for f in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)
    ]
    if shutil.which("tar"):
        for fmt, long in (("gnu", 1), ("oldgnu", 1), ("pax", 1), ("ustar", 0), ("v7", 0)):
            root = tmp_path_factory.mktemp(fmt)
            tree(root, bool(long))
            shards.append(gnu_tar(root, fmt))
    return shards


def headers_of(data: bytes) -> list[int]:
    """The offsets of the headers of a well-formed archive, walked by their size fields."""
    out, pos = [], 0
    while pos + BLOCK <= len(data) and any(data[pos : pos + BLOCK]):
        out.append(pos)
        info = tarfile.TarInfo.frombuf(data[pos : pos + BLOCK], "utf-8", "surrogateescape")
        has_data = info.type not in b"123456"
        pos += BLOCK + (-(-info.size // BLOCK) * BLOCK if has_data else 0)
    return out


INTERESTING = [0, 0x20, 0x2F, 0x2E, 0x30, 0x37, 0x38, 0x0A, 0x3D, 0x80, 0xFF, 0x7F]
FIELDS = [
    (0, 100),
    (100, 124),
    (124, 136),
    (148, 156),
    (156, 157),
    (157, 257),
    (257, 265),
    (345, 500),
]
TYPES = b"01234567LKSxgXVMND\0A"


def poke(out: bytearray, at: int, value: int) -> None:
    if 0 <= at < len(out):
        out[at] = value


def field_byte(out: bytearray, head: int, rng: random.Random) -> None:
    lo, hi = rng.choice(FIELDS)
    poke(out, head + rng.randrange(lo, hi), rng.choice([*INTERESTING, rng.randrange(256)]))


def data_byte(out: bytearray, head: int, rng: random.Random) -> None:
    """A byte of the data after a header: pax records, long names, files."""
    at = head + BLOCK + rng.randrange(40)
    poke(out, at, rng.choice(INTERESTING + list(b"0123456789 =")))


def size_field(out: bytearray, head: int, rng: random.Random) -> None:
    if head + 136 > len(out):
        return type_flag(out, head, rng)
    size = rng.choice([-1, -512, 0, 1, 511, 512, 513, 10**6, 2**40, rng.randrange(9999)])
    out[head + 124 : head + 136] = base256(size) if size < 0 or size > 2**33 else octal(size)


def type_flag(out: bytearray, head: int, rng: random.Random) -> None:
    poke(out, head + 156, rng.choice(TYPES))


def record_length(out: bytearray, head: int, rng: random.Random) -> None:
    """The first bytes after a header: a pax record's length, a name's, a file's."""
    at = head + BLOCK
    if at + 2 <= len(out):
        out[at : at + 2] = rng.choice([b"0 ", b"1 ", b"4 ", b"00", b"9 ", b"99", b"-1"])


def any_byte(out: bytearray, head: int, rng: random.Random) -> None:
    poke(out, rng.randrange(len(out)), rng.randrange(256))


def block(out: bytearray, head: int, rng: random.Random) -> None:
    """A block zeroed, repeated or cut out."""
    if len(out) <= BLOCK:
        return insert(out, head, rng)
    at = rng.randrange(len(out) // BLOCK) * BLOCK
    kind = rng.randrange(3)
    old = bytes(BLOCK) if kind == 0 else bytes(out[at : at + BLOCK])
    out[at : at + BLOCK] = old * (kind < 2) + old * (kind == 1)


def insert(out: bytearray, head: int, rng: random.Random) -> None:
    at = rng.randrange(len(out))
    out[at:at] = rng.randbytes(rng.randint(1, 600))


def truncate(out: bytearray, head: int, rng: random.Random) -> None:
    del out[rng.randrange(len(out)) :]


# Mutations by the share of draws below each bound; those above CHECKSUMMED shift bytes.
MUTATIONS = [
    (0.35, field_byte),
    (0.5, data_byte),
    (0.6, size_field),
    (0.7, type_flag),
    (0.75, record_length),
    (0.8, any_byte),
    (0.85, block),
    (0.92, insert),
    (1.0, truncate),
]
CHECKSUMMED = 0.75


def mutate(data: bytes, heads: list[int], rng: random.Random) -> bytes:
    """One to four mutations of ``data``: bytes in header fields, in pax and long-name
    records or anywhere; a size field, a type or a record length rewritten; a block zeroed,
    repeated or cut out; bytes inserted; a truncation. Headers keep a valid checksum most
    of the time, so that the mutations reach past the checksum check."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op, head = rng.random(), rng.choice(heads)
        if not out:
            break
        next(change for bound, change in MUTATIONS if op < bound)(out, head, rng)
        if op < CHECKSUMMED and rng.random() < 0.8:
            for h in heads:
                if h + BLOCK <= len(out):
                    out[h : h + BLOCK] = checksummed(out[h : h + BLOCK])
    return bytes(out)


def test_mutated_real_shards_are_read_as_tarfile_reads_them_or_fail_naming_the_offset(
    corpus, monkeypatch
):
    """Each mutated shard: the samples tarfile reads from the same bytes, exactly, or a
    FetchError naming the shard and an offset, after a prefix of them."""
    with fuzzing(monkeypatch) as runner:  # the unmutated shards: as tarfile reads them
        for shard in corpus:
            want = reference(tarfile_members(shard), closed_only=False)
            assert runner.read(shard, 0).delivered == want[0] and want[1] is None
    rng = random.Random(CASES)
    heads = [headers_of(shard) for shard in corpus]
    with fuzzing(monkeypatch) as runner:
        for case in range(MUTATED):
            which = rng.randrange(len(corpus))
            data = mutate(corpus[which], heads[which], rng)
            try:
                judge(runner, data, corpus[which], case)
            except AssertionError as exc:
                exc.add_note(f"case {case}: shard {which} mutated to {data!r}")
                raise
    report("mutated", runner)


def judge(runner: Runner, data: bytes, original: bytes, case: int) -> None:
    got = runner.read(data, case)
    if got.error is None:
        want, fault = reference(tarfile_members(data), closed_only=False)
        assert fault is None and got.delivered == want, (got.delivered, want)
        same = got.delivered == reference(tarfile_members(original), closed_only=False)[0]
        runner.counts["delivered, as the original" if same else "delivered, as tarfile"] += 1
        return
    # What precedes the fault is what tarfile reads from the bytes before it, but for the
    # sample still open there.
    before = reference(tarfile_members(data[: got.offset] + END), closed_only=False)[0]
    assert got.delivered == before[: len(got.delivered)], (got.delivered, before)
    assert len(got.delivered) >= len(before) - 1, (got, before)
    runner.counts[label(got)] += 1


def label(got: Outcome) -> str:
    """The outcome's name in the counts."""
    if got.error is None:
        return "delivered"
    grouping = any(w in got.error.cause for w in ("repeats", "reserved", "fields"))
    return f"FetchError ({'grouping' if grouping else got.kind})"


# -- end to end ------------------------------------------------------------------------------


def test_shards_end_to_end_through_the_loader_with_either_on_error(corpus, monkeypatch, tmp_path):
    """Runs of 8 shards (half mutated) through AsyncLoader: with "raise", every shard's
    samples or a FetchError naming one; with "skip", each shard's samples up to its fault
    and the rest counted as skipped."""
    monkeypatch.setattr(_tar, "MAX_FIELDS", MAX_FIELDS)
    quiet(monkeypatch)
    rng = random.Random(CASES + 1)
    heads = [headers_of(shard) for shard in corpus]
    counts: Counter = Counter()
    loop = asyncio.new_event_loop()
    alone = Runner(loop)
    try:
        with no_spin(None):
            for run in range(END_TO_END // 8):
                paths, declared, alone_read = [], [], []
                for i in range(8):
                    which = rng.randrange(len(corpus))
                    data = corpus[which]
                    if rng.random() < 0.5:
                        data = mutate(data, heads[which], rng)
                    path = tmp_path / f"r{run}-{i}.tar"
                    path.write_bytes(data)
                    paths.append(str(path))
                    declared.append(len(reference(tarfile_members(corpus[which]), False)[0]))
                    alone_read.append(alone.read(data, run))
                with budget(5.0):
                    loader_run(paths, declared, alone_read, "skip" if run % 2 else "raise", counts)
    finally:
        loop.close()
    shards = sum(n for what, n in counts.items() if what.endswith(("whole", "failed")))
    print(f"\nend to end: {shards} shards, {dict(sorted(counts.items()))}")


def loader_run(
    paths: list[str], declared: list[int], alone: list[Outcome], on_error: str, counts: Counter
) -> None:
    """One loader over ``paths``; checks each shard's samples against its read alone: a
    prefix of them; all of them (as many as declared) when it reads whole; the rest skipped
    (under "skip") or a FetchError naming a shard (under "raise") when one does not."""
    got, error, skipped = load(paths, declared, on_error)
    whole = [reads_whole(a, n) for a, n in zip(alone, declared, strict=True)]
    lost = 0
    for shard, a, n, ok in zip(paths, alone, declared, whole, strict=True):
        lost += shard_lost(got, shard, a, n, ok and error is None)
        counts[f"{on_error}: {'whole' if ok else 'failed'}"] += 1
    if on_error == "skip":  # what each failed shard lost, no more
        assert error is None and skipped == lost, (error, skipped, lost)
        counts["skip: samples skipped"] += skipped
    else:  # a FetchError naming a shard when one fails
        assert (error is None) == all(whole), (error, whole)
        assert getattr(error, "target", paths[0]) in paths, error


def reads_whole(alone: Outcome, declared: int) -> bool:
    return alone.error is None and len(alone.delivered) == declared


def shard_lost(got: list[Sample], shard: str, alone: Outcome, declared: int, whole: bool) -> int:
    """What the skip of ``shard`` must count (0 when it reads whole); checks that its
    samples in ``got`` are a prefix of those it gives alone, all of them when ``whole``."""
    mine = as_pairs([s for s in got if s["__url__"] == shard])
    assert mine == alone.delivered[: len(mine)]
    if whole:
        assert len(mine) == declared
        return 0
    return 0 if reads_whole(alone, declared) else max(declared - len(mine), 1)


def load(
    paths: list[str], declared: list[int], on_error: str
) -> tuple[list[Sample], FetchError | None, int]:
    """``(samples, error, skipped)`` of one epoch of AsyncLoader over the shards, within
    5 s (else once more within 60 s, as :meth:`Runner.read`)."""
    try:
        return load_within(paths, declared, on_error, 5.0)
    except TimeoutError:
        return load_within(paths, declared, on_error, 60.0)


def load_within(
    paths: list[str], declared: list[int], on_error: str, deadline: float
) -> tuple[list[Sample], FetchError | None, int]:
    source = ShardedSource(
        paths,
        samples_per_shard=declared,
        shuffle=False,
        shuffle_buffer=1,
        retry=ONCE,
        on_error=on_error,
        max_skipped=10**6 if on_error == "skip" else None,
    )
    got: list[Sample] = []

    async def run() -> None:
        async with AsyncLoader(source, batch_size=4, collate_fn=list) as loader:
            async for batch in loader:
                got.extend(batch)

    try:
        asyncio.run(asyncio.wait_for(run(), deadline))
    except FetchError as exc:
        return got, exc, source.skipped
    return got, None, source.skipped
