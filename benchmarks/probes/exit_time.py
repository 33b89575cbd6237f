"""Exit times, asyncloader against ``torch.utils.data.DataLoader``:

- **raise**: a training step raises while its process holds the loader's iterator
  (``batches = iter(loader); for _ in batches: raise ...``; 1 worker, batch_size 1, a million
  shuffled samples of 10 ms each). Seconds from the raise to the exit of the process that
  raised, and to the exit of the last process it had started: as a plain script, and as a
  ``multiprocessing`` child (fork, spawn) that its parent joins.
- **kill**: a training process iterating with 2 workers is SIGKILLed after its first batch.
  Seconds until its workers have exited, and until everything it started (the fork server
  and the resource tracker too) has: asyncloader iterating in the main thread (it forks its
  workers) and in another thread (it uses the fork server), DataLoader for reference.

Exits are seen through pidfds (readable once a process has exited, whoever reaps it).

Each measurement runs in a fresh process, cases alternating, ``--reps`` times; the table
shows medians and ranges. A case that has not finished after ``--limit`` seconds counts as
that limit (shown with ``>``) and its processes are killed.
``python -m benchmarks.probes.exit_time [--reps 5] [--limit 60]``. Linux only (pidfds).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import multiprocessing
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import psutil
import torch

from benchmarks.side_by_side import ROOT

LOADERS = ("asyncloader", "DataLoader")
RAISE_HOWS = ("plain", "fork", "spawn")
#: kill case -> (loader, where the training loop runs)
KILL_CASES = {
    "asyncloader, main thread (fork)": ("asyncloader", "main"),
    "asyncloader, other thread (fork server)": ("asyncloader", "thread"),
    "DataLoader, main thread (fork)": ("DataLoader", "main"),
}
#: Seconds a child may take to import torch and start its workers.
START_S = 60.0


class Slow(torch.utils.data.Dataset):
    """A million samples of 10 ms each: the epoch is far from over at the raise or the kill."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> int:
        time.sleep(0.01)
        return index


def _loader(name: str, batch_size: int, num_workers: int, shuffle: bool) -> Any:
    # This module by its real name, not __main__: workers started by the fork server or by
    # spawn must be able to import the dataset's class.
    from benchmarks.probes import exit_time

    dataset = exit_time.Slow()
    if name == "asyncloader":
        from asyncloader import AsyncLoader

        return AsyncLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=shuffle)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, shuffle=shuffle
    )


def raise_with_live_iterator(loader_name: str) -> None:
    """Child: prints ``raising <monotonic>`` and raises while the iterator is live."""
    batches = iter(_loader(loader_name, batch_size=1, num_workers=1, shuffle=True))
    for _ in batches:
        print("raising", time.monotonic(), os.getpid(), flush=True)
        raise RuntimeError("the training step failed")


def _child_raise(loader_name: str, how: str, limit: float) -> None:
    if how == "plain":
        raise_with_live_iterator(loader_name)
    from benchmarks.probes import exit_time

    target = functools.partial(exit_time.raise_with_live_iterator, loader_name)
    child = multiprocessing.get_context(how).Process(target=target)
    child.start()
    child.join(limit)
    if child.exitcode is None:
        child.kill()
        child.join()


def _child_train(loader_name: str, where: str) -> None:
    """Child: iterates for ever with 2 workers, printing "ready" after the first batch."""

    def train() -> None:
        for k, _ in enumerate(_loader(loader_name, batch_size=4, num_workers=2, shuffle=False)):
            if k == 0:
                print("ready", flush=True)

    if where == "main":
        train()
    else:
        thread = threading.Thread(target=train, name="trainer")
        thread.start()
        thread.join()


class _Child:
    """A fresh ``python -m benchmarks.probes.exit_time --child ...`` in a session of its own;
    its stdout read with deadlines; its whole process group killed on the way out."""

    def __init__(self, stderr: IO[bytes], *args: str) -> None:
        self.stderr = stderr
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.probes.exit_time", "--child", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            start_new_session=True,
        )
        self.pidfd = os.pidfd_open(self.proc.pid)
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.fileno()
        self._buffer = b""
        self.closed = False

    def line(self, deadline: float) -> str | None:
        """The next line, or ``None`` at end of output or past ``deadline``."""
        while b"\n" not in self._buffer:
            if self.closed or not self._read(deadline):
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self._out], [], [], left)[0]:
            return False
        chunk = os.read(self._out, 65536)
        self._buffer += chunk
        self.closed = not chunk
        return True

    def failure(self, what: str) -> RuntimeError:
        """An error saying ``what`` went wrong, with the end of the child's stderr."""
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace")[-2000:]
        return RuntimeError(f"{what}; its stderr ends:\n{tail}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.close(self.pidfd)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@contextlib.contextmanager
def _child(*args: str) -> Iterator[_Child]:
    with tempfile.TemporaryFile() as stderr:
        child = _Child(stderr, *args)
        try:
            yield child
        finally:
            child.kill()


def _exit_times(procs: list[psutil.Process], deadline: float) -> dict[int, float]:
    """pid -> the ``time.monotonic()`` at which each process exited (a pidfd became
    readable), ``math.inf`` for those still running at ``deadline``. Processes already gone
    count as exited now."""
    now = time.monotonic()
    fds, times = {}, {}
    for proc in procs:
        try:
            fds[os.pidfd_open(proc.pid)] = proc.pid
        except ProcessLookupError:
            times[proc.pid] = now
    try:
        while len(times) < len(procs):
            left = deadline - time.monotonic()
            waiting = [fd for fd, pid in fds.items() if pid not in times]
            ready = select.select(waiting, [], [], max(0.0, left))[0]
            now = time.monotonic()
            if not ready:
                break
            times.update((fds[fd], now) for fd in ready)
    finally:
        for fd in fds:
            os.close(fd)
    return {proc.pid: times.get(proc.pid, math.inf) for proc in procs}


def _is_helper(proc: psutil.Process) -> bool:
    """The resource tracker, or the fork server (whose children, the workers, carry the same
    command line)."""
    with contextlib.suppress(psutil.Error):
        cmdline = " ".join(proc.cmdline())
        parent = proc.parent()
        return "resource_tracker" in cmdline or (
            "forkserver" in cmdline
            and parent is not None
            and "forkserver" not in " ".join(parent.cmdline())
        )
    return False


def measure_raise(loader_name: str, how: str, limit: float) -> tuple[float, float]:
    """(seconds from the raise to the exit of the process that raised, to the exit of the
    last process it had started)."""
    with _child("raise", loader_name, how, str(limit)) as child:
        line = child.line(time.monotonic() + START_S)
        if line is None or not line.startswith("raising"):
            raise child.failure(f"{loader_name} {how}: no raise ({line!r})")
        _, at, pid = line.split()
        raised = float(at)
        try:
            raiser = psutil.Process(int(pid))
            family = [raiser, *raiser.children(recursive=True)]
        except psutil.NoSuchProcess:  # it exited already
            return 0.0, 0.0
        times = _exit_times(family, raised + limit)
    return min(times[raiser.pid] - raised, limit), min(max(times.values()) - raised, limit)


def measure_kill(loader_name: str, where: str, limit: float) -> tuple[float, float]:
    """(seconds from the SIGKILL of a training process to the exit of its workers, to the
    exit of all it started)."""
    with _child("train", loader_name, where) as child:
        if child.line(time.monotonic() + START_S) != "ready":
            raise child.failure(f"{loader_name} {where}: not ready")
        family = psutil.Process(child.proc.pid).children(recursive=True)
        helpers = {proc.pid for proc in family if _is_helper(proc)}
        killed = time.monotonic()
        child.proc.kill()
        times = _exit_times(family, killed + limit)
    workers = [t for pid, t in times.items() if pid not in helpers]
    return min(max(workers) - killed, limit), min(max(times.values()) - killed, limit)


def _cell(values: list[float], limit: float) -> str:
    median = statistics.median(values)
    mark = ">" if median >= limit else " "
    return f"{mark}{median:6.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "raise":
            _child_raise(rest[0], rest[1], float(rest[2]))
        else:
            _child_train(*rest)
        return
    raised: dict[tuple[str, str], list[tuple[float, float]]] = {
        (how, name): [] for how in RAISE_HOWS for name in LOADERS
    }
    killed: dict[str, list[tuple[float, float]]] = {case: [] for case in KILL_CASES}
    for _ in range(args.reps):
        for how, name in raised:
            raised[how, name].append(measure_raise(name, how, args.limit))
        for case, (name, where) in KILL_CASES.items():
            killed[case].append(measure_kill(name, where, args.limit))
    print(f"exit after a raise with a live iterator: seconds, median [range] of {args.reps}")
    print("how    loader         process exited        all it started gone")
    for (how, name), runs in raised.items():
        exits = _cell([r[0] for r in runs], args.limit)
        gones = _cell([r[1] for r in runs], args.limit)
        print(f"{how:6s} {name:12s} {exits:22s} {gones}")
    print(f"\nexit after SIGKILL of the training process: seconds, median [range] of {args.reps}")
    print("case                                     workers gone          all it started gone")
    for case, runs in killed.items():
        workers = _cell([r[0] for r in runs], args.limit)
        every = _cell([r[1] for r in runs], args.limit)
        print(f"{case:40s} {workers:22s} {every}")
    print("load average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
