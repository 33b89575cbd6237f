"""Tar bytes for the tar reader's tests, built block by block: headers of any type with any
size field (octal or base-256, negative included), pax records, GNU long names; and
:func:`no_spin`, which turns a loop that never awaits nor returns into an exception.

Python's ``tarfile`` writes the header fields; the size field and the checksum are then
set here, so that a header can say what no writer would.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import tarfile
import time
from collections.abc import Iterator

BLOCK = 512
END = bytes(2 * BLOCK)


def padded(data: bytes) -> bytes:
    """``data`` and the zeros up to the next block boundary."""
    return data + bytes(-len(data) % BLOCK)


def octal(n: int) -> bytes:
    """A 12-byte size field in octal (``n >= 0``)."""
    return b"%011o\0" % n


def base256(n: int) -> bytes:
    """A 12-byte size field in GNU's base-256 (negative numbers included)."""
    if n >= 0:
        return b"\x80" + n.to_bytes(11, "big")
    return b"\xff" + (256**11 + n).to_bytes(11, "big")


def checksummed(block: bytearray) -> bytes:
    """``block`` with its checksum field recomputed (sum of the bytes, the field as spaces)."""
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def header(name: str, kind: bytes = tarfile.REGTYPE, size: int | bytes = 0) -> bytes:
    """A ustar header of type ``kind`` named ``name`` (at most 100 bytes) whose size field
    says ``size`` (an int: octal, or base-256 when negative; bytes: the field as given)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
    if isinstance(size, int):
        size = octal(size) if size >= 0 else base256(size)
    block[124:136] = size
    return checksummed(block)


def member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    """A header and its data, padded."""
    return header(name, kind, len(data)) + padded(data)


def record(key: str, value: str) -> bytes:
    """One pax record, ``"<length> key=value\\n"``, its length counting itself."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length).encode()) + len(body) != length:
        length += 1
    return str(length).encode() + body


def pax(records: bytes | dict[str, str], kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A pax header (``x``, or ``g`` global) holding ``records`` (raw bytes or a dict)."""
    if isinstance(records, dict):
        records = b"".join(record(k, v) for k, v in records.items())
    return member("././@PaxHeader", records, kind)


def long_name(name: bytes) -> bytes:
    """A GNU long-name header (``L``) whose data is ``name`` as given (add the NUL)."""
    return member("././@LongLink", name, tarfile.GNUTYPE_LONGNAME)


def archive(*parts: bytes) -> bytes:
    """The parts, then the end-of-archive blocks."""
    return b"".join(parts) + END


class Spin(BaseException):
    """Code ran on for its whole CPU budget without returning: a spin (or far too slow).
    A BaseException, so that no ``except Exception`` of the code under test hides it."""


def _alarm(signum: int, frame: object) -> None:
    raise Spin("still running after its CPU budget: a loop that never awaits nor ends")


@contextlib.contextmanager
def no_spin(cpu_s: float | None) -> Iterator[None]:
    """Raises :class:`Spin` in the main thread once the process has spent ``cpu_s`` seconds
    of CPU inside the block (a ``SIGVTALRM`` interval timer; the main thread only).

    An ``asyncio.wait_for`` deadline cannot end a loop that never awaits; this can, since
    Python runs signal handlers between bytecodes. With ``cpu_s=None`` only the blocks of
    :func:`budget` inside are timed (one per fuzz case).
    """
    # The test session's heap is frozen: a full collection inside a block scans only what
    # the block made, not the million objects of the tests before it (seconds of CPU on a
    # loaded machine, charged to whichever case it fell in). Not collected first: that full
    # collection would cost the same, once per block; the garbage waits for the unfreeze.
    gc.freeze()
    previous = signal.signal(signal.SIGVTALRM, _alarm)
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_s or 0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
        gc.unfreeze()


@contextlib.contextmanager
def budget(cpu_s: float) -> Iterator[None]:
    """Inside :func:`no_spin`: ``cpu_s`` seconds of CPU for this block alone; an enclosing
    budget goes on afterwards, less what this block spent."""
    if signal.getsignal(signal.SIGVTALRM) is not _alarm:
        raise RuntimeError("budget() outside no_spin(): SIGVTALRM would end the process")
    outer, _ = signal.setitimer(signal.ITIMER_VIRTUAL, cpu_s)
    began = time.process_time()
    try:
        yield
    finally:
        spent = time.process_time() - began
        signal.setitimer(signal.ITIMER_VIRTUAL, max(outer - spent, 1e-3) if outer else 0)
