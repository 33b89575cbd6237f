"""What the loader does, recorded as Chrome trace events while a trace is active.

At most one :class:`Recorder` per process is active (:data:`ACTIVE`). Every hook reads
:data:`ACTIVE` once and does nothing more when it is ``None``: with no trace active the cost
is that read, once per batch or per event (never per sample).

Events are kept as tuples in a ring (the last ``capacity``; older ones are dropped and
counted), and made into trace-event dicts only when the trace is written.

The clock is ``time.monotonic_ns()`` (``CLOCK_MONOTONIC`` on Linux), in microseconds: one
clock for every process of a machine, so a worker's events line up with the training
process's without adjustment.

In a worker process the recorder is started by the first request that asks for it
(:func:`worker_recording`); the events recorded since the last answer go back with the next
answer as a :class:`Traced` (:func:`with_events`), which the training process unwraps
(:func:`absorb`).

Threads: events are appended from any thread (``deque.append`` is atomic); a trace is read
from copies (``deque.copy``, ``dict.copy``: one C call each under the GIL), so loaders still
running while it is written or drawn do not disturb it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

#: This process's recorder while a trace is active, else ``None``.
ACTIVE: Recorder | None = None

#: A folder: every process that builds a loader records and writes its trace there at exit.
ENV = "ASYNCLOADER_TRACE"
#: Events a recorder keeps by default (about 200 bytes each): the last ones, in a ring.
CAPACITY = 500_000

# An event: (phase, name, category, ts_us, dur_us, pid, tid, id, args).
Event = tuple[str, str, str, float, float, int, int, int, Any]


#: The name of the process that iterates the loaders, in a trace.
TRAINING_PROCESS = "training process"


def now_us() -> float:
    """The trace clock, in microseconds."""
    return time.monotonic_ns() / 1e3


class Recorder:
    """The events of one process (and those its workers sent back), in a ring."""

    def __init__(self, process_name: str, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity!r}")
        self.events: deque[Event] = deque(maxlen=capacity)
        self.recorded = 0  # events ever added (about: threads add unlocked); the rest dropped
        self.pid = os.getpid()
        self.processes: dict[int, str] = {self.pid: process_name}
        self.threads: dict[tuple[int, int], str] = {}
        #: A worker's own iteration: its batch ``n`` is the flow ``flow_of(n)``.
        self.flow_of: Callable[[int], int] | None = None
        self.aliases: dict[int, int] = {}  # the consumer's batch -> the flow that ends there
        self._lock = threading.Lock()  # names only: deque.append is atomic

    def _tid(self) -> int:
        tid = threading.get_native_id()
        key = (self.pid, tid)
        if key not in self.threads:
            with self._lock:
                self.threads[key] = threading.current_thread().name
        return tid

    def add(self, ph: str, name: str, cat: str, ts: float, dur: float = 0.0, **kw: Any) -> None:
        """One event on the calling thread; ``id`` (async slices, flows) and ``args`` in ``kw``."""
        self.recorded += 1
        self.events.append(
            (ph, name, cat, ts, dur, self.pid, self._tid(), kw.get("id", 0), kw.get("args"))
        )

    def drain(self) -> tuple[list[Event], dict[int, str], dict[tuple[int, int], str]]:
        """The events recorded since the last drain, and the names (a worker's answer)."""
        events = []
        while self.events:
            events.append(self.events.popleft())
        return events, dict(self.processes), dict(self.threads)

    def absorb(self, traced: Traced) -> None:
        """Events another process recorded (a worker's), with its names."""
        self.processes.update(traced.processes)
        self.threads.update(traced.threads)
        self.recorded += len(traced.events)
        self.events.extend(traced.events)

    def trace_events(self) -> list[dict[str, Any]]:
        """Every event kept, as trace-event dicts, names first."""
        out: list[dict[str, Any]] = []
        events, threads = self.events.copy(), self.threads.copy()
        for pid, name in sorted(self.processes.copy().items()):
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            out.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
            )
        for (pid, tid), name in sorted(threads.items()):
            out.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
        out.extend(_as_dict(event) for event in events)
        return out


def _as_dict(event: Event) -> dict[str, Any]:
    ph, name, cat, ts, dur, pid, tid, ident, args = event
    made: dict[str, Any] = {"ph": ph, "name": name, "cat": cat, "ts": ts, "pid": pid, "tid": tid}
    if ph == "X":
        made["dur"] = dur
    elif ph in ("b", "e", "s", "f"):
        made["id"] = ident
        if ph == "f":
            made["bp"] = "e"  # bound to the slice that encloses it
    elif ph == "i":
        made["s"] = "t"
    if args is not None:
        made["args"] = args
    return made


@contextlib.contextmanager
def _timed(recorder: Recorder, name: str, cat: str, args: Any) -> Iterator[None]:
    began = now_us()
    try:
        yield
    finally:
        recorder.add("X", name, cat, began, now_us() - began, args=args)


_OFF = contextlib.nullcontext()


def span(
    name: str, seq: int | None = None, samples: int | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A slice on the calling thread around the ``with`` block, named ``"<name> <seq>"``
    (batch ``seq``, of ``samples`` samples), while a trace is active; the name is made only
    then."""
    recorder = ACTIVE
    if recorder is None:
        return _OFF
    args = None if samples is None else {"samples": samples}
    return _timed(recorder, name if seq is None else f"{name} {seq}", "stage", args)


def instant(name: str, cat: str, args: Any = None) -> None:
    """A point in time (a retry, a skip, a tuner's decision), while a trace is active."""
    recorder = ACTIVE
    if recorder is not None:
        recorder.add("i", name, cat, now_us(), args=args)


def counter(name: str, values: Mapping[str, float]) -> None:
    """Values of a counter track (``{"in flight": 12, "limit": 64}``), while a trace is active."""
    recorder = ACTIVE
    if recorder is not None:
        recorder.add("C", name, "counter", now_us(), args=values)


def begin(cat: str, name: str, seq: int, samples: int | None = None) -> None:
    """The start of batch ``seq``'s async slice ``"<name> <seq>"`` in the track ``cat`` (a
    slice that overlaps others on its thread)."""
    recorder = ACTIVE
    if recorder is not None:
        args = None if samples is None else {"samples": samples}
        recorder.add("b", f"{name} {seq}", cat, now_us(), id=seq, args=args)


def end(cat: str, name: str, seq: int) -> None:
    """The end of the slice :func:`begin` started."""
    recorder = ACTIVE
    if recorder is not None:
        recorder.add("e", f"{name} {seq}", cat, now_us(), id=seq)


def flow(ph: str, ident: int) -> None:
    """One end of an arrow from a batch's work (``ph="s"``, in the slice then open) to its
    delivery (``ph="f"``)."""
    recorder = ACTIVE
    if recorder is not None:
        if recorder.flow_of is not None:
            ident = recorder.flow_of(ident)
        recorder.add(ph, "batch", "flow", now_us(), id=ident)


def stream_flows(worker: int, workers: int) -> None:
    """In a worker iterating its own part of an iterable: its batch ``n`` is the epoch's
    ``n * workers + worker`` for the arrows (the training process says which it delivered
    as which: :func:`alias`)."""
    recorder = ACTIVE
    if recorder is not None and recorder.flow_of is None:
        recorder.flow_of = lambda n: n * workers + worker


def alias(seq: int, ident: int) -> None:
    """The consumer's batch ``seq`` is the flow ``ident`` a worker started."""
    recorder = ACTIVE
    if recorder is not None:
        recorder.aliases[seq] = ident


class Traced:
    """A worker's answer and the events it recorded since its last answer."""

    __slots__ = ("events", "processes", "result", "threads")

    def __init__(self, result: Any, drained: tuple[Any, Any, Any]) -> None:
        self.result = result
        self.events, self.processes, self.threads = drained

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (self.result, self.events, self.processes, self.threads)


def _rebuilt(result: Any, events: Any, processes: Any, threads: Any) -> Traced:
    return Traced(result, (events, processes, threads))


def absorb(result: Any) -> Any:
    """A worker's answer without its events, which go to this process's trace (if any)."""
    if type(result) is not Traced:
        return result
    recorder = ACTIVE
    if recorder is not None:
        recorder.absorb(result)
    return result.result


def _forget() -> None:
    """In a forked child: the parent's recorder is not this process's."""
    global ACTIVE
    ACTIVE = None


os.register_at_fork(after_in_child=_forget)


def worker_recording(trace: bool, name: Callable[[], str]) -> None:
    """In a worker, before a request: records while the training process is tracing
    (``trace``), as ``name()``; else stops a recorder left from an earlier trace."""
    global ACTIVE
    if not trace:
        ACTIVE = None
    elif ACTIVE is None:
        ACTIVE = Recorder(name())


def with_events(result: Any) -> Any:
    """In a worker, a request's answer: with the events recorded since the last answer while
    recording (a :class:`Traced`), else as it is."""
    recorder = ACTIVE
    return result if recorder is None else Traced(result, recorder.drain())


def clock() -> float:
    """:func:`now_us` while a trace is active, else 0 (not read)."""
    return now_us() if ACTIVE is not None else 0.0


def waited(began: float, seq: int) -> None:
    """The consumer waited from ``began`` (:func:`clock`) until now for batch ``seq``: a slice
    named with ``seq``, where the arrow from its work in a worker ends."""
    recorder = ACTIVE
    if recorder is not None and began:
        ended = now_us()
        recorder.add(
            "X", f"wait for batch {seq}", "wait", began, ended - began, args={"batch": seq}
        )
        ident = recorder.aliases.pop(seq, seq)
        recorder.add("f", "batch", "flow", (began + ended) / 2, id=ident)


def write(recorder: Recorder, path: str | os.PathLike[str]) -> None:
    """``recorder``'s events as a trace file at ``path`` (its folder made if needed)."""
    mono, wall = now_us(), time.time_ns() / 1e3
    document = {
        "traceEvents": recorder.trace_events(),
        "displayTimeUnit": "ms",
        "otherData": {
            "rank": rank(),
            "host": socket.gethostname(),
            "clock": "monotonic, microseconds",
            "wall_minus_clock_us": wall - mono,  # aligns traces of several machines
            "recorded": recorder.recorded,
            "dropped": max(0, recorder.recorded - len(recorder.events)),
        },
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document))


def from_environment() -> None:
    """Starts recording for the rest of this process when :data:`ENV` names a folder (and
    no trace is active); the trace is written there at exit, one file per process."""
    global ACTIVE
    folder = os.environ.get(ENV)
    if not folder or ACTIVE is not None:
        return
    recorder = ACTIVE = Recorder(TRAINING_PROCESS)
    name = f"{socket.gethostname()}-rank{rank()}-pid{os.getpid()}.json"
    atexit.register(_write_at_exit, recorder, Path(folder) / name)


def _write_at_exit(recorder: Recorder, path: Path) -> None:
    global ACTIVE
    if ACTIVE is recorder:
        ACTIVE = None
    write(recorder, path)


def rank() -> int | None:
    """This process's rank (torchrun's ``RANK``), or None."""
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None
