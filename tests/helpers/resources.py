"""What a process tree holds, for the soak (tests/stress/test_soak.py): memory, files, threads, and
shared memory, read from /proc and psutil (Linux).

A :class:`Usage` is one reading of the training process and its workers; :func:`growth`
compares two readings against bands and names every figure out of its band.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

SHM = "/dev/shm"


@dataclass(frozen=True)
class Usage:
    """One reading of a process tree: the training process (this one), then its workers.

    Attributes:
        rss: Resident bytes per process, the training process first.
        fds: Open file descriptors per process, less sockets on the server's port.
        connections: Connections to the server's port per process (client ends).
        threads: OS threads per process (torch's and the C libraries' included).
        py_threads: Python threads alive in the training process.
        shm_entries: Names in /dev/shm that the tree maps or holds open, or that torch named
            after one of its pids (``torch_<pid>_*``).
        shm_bytes: Their sizes, summed.
        shm_mapped: Mappings of /dev/shm files in the tree, unlinked ones included (a tensor
            shared with a worker and still referenced): their count.
        shm_mapped_bytes: Those mappings' sizes, summed.
    """

    rss: tuple[int, ...]
    fds: tuple[int, ...]
    connections: tuple[int, ...]
    threads: tuple[int, ...]
    py_threads: int
    shm_entries: int
    shm_bytes: int
    shm_mapped: int
    shm_mapped_bytes: int


def _shm_maps(pid: int) -> list[tuple[str, int]]:
    """(name, bytes) of each /dev/shm mapping of ``pid`` ("(deleted)" kept in the name)."""
    found = []
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if f"{SHM}/" not in line:
                continue
            span, name = line.split()[0], line.split(f"{SHM}/", 1)[1].strip()
            start, end = (int(x, 16) for x in span.split("-"))
            found.append((name, end - start))
    return found


def _shm_open(pid: int) -> set[str]:
    """Names of /dev/shm files that ``pid`` holds open."""
    names = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"{SHM}/"):
                    names.add(target.removeprefix(f"{SHM}/"))
    return names


def shm_of(pids: Sequence[int]) -> tuple[set[str], list[tuple[str, int]]]:
    """The /dev/shm entries of processes ``pids`` (mapped, open, or named ``torch_<pid>_*``),
    which exist now; and every /dev/shm mapping of theirs, (name, bytes), unlinked or not.

    /dev/shm is shared by every process on the machine: a plain listing would count other
    test runs' entries too.
    """
    maps = [m for pid in pids for m in _shm_maps(pid)]
    used = {name for name, _ in maps}.union(*(_shm_open(pid) for pid in pids))
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    listed = set(os.listdir(SHM))
    return (used & listed) | {n for n in listed if n.startswith(prefixes)}, maps


def _sockets_of(proc: psutil.Process, port: int | None) -> tuple[set[int], int]:
    """The fds of ``proc``'s TCP sockets on ``port`` (either end), and how many of them are
    connections to it (client ends)."""
    if port is None:
        return set(), 0
    fds, clients = set(), 0
    for conn in proc.net_connections("tcp"):
        client = bool(conn.raddr) and conn.raddr.port == port
        if client or (bool(conn.laddr) and conn.laddr.port == port):
            fds.add(conn.fd)
            clients += client
    return fds, clients


def usage(workers: Sequence[int], server_port: int | None = None) -> Usage:
    """Reads this process and ``workers`` (pids).

    With ``server_port`` (a test server's), sockets on that port are left out of ``fds``: the
    server's own ends when it runs in this process, and the connections to it, which a
    client keeps as a cache whose size at any instant depends on which request a fault hit
    last; ``connections`` counts those per process, to be checked against their pool's bound.

    Collects garbage first: what only awaits the cycle collector (a closed pool's semaphores
    from an earlier test) is not held, and would make two readings differ by chance.
    """
    gc.collect()
    procs = [psutil.Process(), *(psutil.Process(pid) for pid in workers)]
    pids = [p.pid for p in procs]
    fds, connections = [], []
    for proc in procs:
        sockets, clients = _sockets_of(proc, server_port)
        fds.append(len(set(os.listdir(f"/proc/{proc.pid}/fd")) - {str(fd) for fd in sockets}))
        connections.append(clients)
    entries, maps = shm_of(pids)
    sizes = []
    for name in entries:
        with contextlib.suppress(OSError):
            sizes.append(os.stat(f"{SHM}/{name}").st_size)
    return Usage(
        rss=tuple(p.memory_info().rss for p in procs),
        fds=tuple(fds),
        connections=tuple(connections),
        threads=tuple(p.num_threads() for p in procs),
        py_threads=threading.active_count(),
        shm_entries=len(entries),
        shm_bytes=sum(sizes),
        shm_mapped=len(maps),
        shm_mapped_bytes=sum(size for _, size in maps),
    )


def out_of_band(name: str, before: int, after: int, band: float, *, grow_only: bool) -> str | None:
    """``None`` when ``after`` moved from ``before`` by at most ``band`` (up only, with
    ``grow_only``); else a line saying by how much it moved."""
    moved = after - before
    if (moved if grow_only else abs(moved)) <= band:
        return None
    return f"{name}: {before} -> {after} (moved {moved:+}, band {band:.0f})"


#: Per process: a figure of Usage, and whether only its growth counts (a drop of resident
#: memory is memory given back, not a leak).
PER_PROCESS = (("rss", True), ("fds", False), ("threads", False))
WHOLE_TREE = ("py_threads", "shm_entries", "shm_bytes", "shm_mapped", "shm_mapped_bytes")


def growth(before: Usage, after: Usage, rel: float, rss_floor: int) -> list[str]:
    """Every figure of ``after`` out of its band around ``before``: within ``rel`` (a fraction)
    either way; resident bytes grown by at most ``rel`` or ``rss_floor`` bytes, the larger.
    Both readings must be of the same processes (a persistent pool), in the same order."""
    assert len(before.rss) == len(after.rss), "not the same processes"
    problems = []
    for field, grow_only in PER_PROCESS:
        floor = rss_floor if field == "rss" else 0
        pairs = zip(getattr(before, field), getattr(after, field), strict=True)
        for i, (b, a) in enumerate(pairs):
            who = "the training process" if i == 0 else f"worker {i - 1}"
            band = max(rel * b, floor)
            problems.append(out_of_band(f"{field} of {who}", b, a, band, grow_only=grow_only))
    for field in WHOLE_TREE:
        b, a = getattr(before, field), getattr(after, field)
        problems.append(out_of_band(field, b, a, rel * b, grow_only=False))
    return [p for p in problems if p is not None]
