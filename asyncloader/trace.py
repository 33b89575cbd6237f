"""One timeline of every loader of a process, its workers and, merged, every rank of a job.

::

    with asyncloader.trace("epoch.json"):
        for batch in loader:
            ...

writes a Chrome trace-event file (open it in https://ui.perfetto.dev or chrome://tracing):
the training process and each worker as processes, their threads named; slices for the
consumer's wait for each batch, each batch's round trip through the engine, its fetch on the
event loop, and in the worker its fetch, transform, collate and hand-off; an arrow from each
batch's hand-off in its worker to its delivery; counters; and instants for retries, skips,
worker crashes and the tuner's decisions.

With ``ASYNCLOADER_TRACE=<dir>`` set, every process that builds a loader records from then on
and writes ``<dir>/<host>-rank<R>-pid<pid>.json`` at exit; ``python -m asyncloader.trace merge
<dir> -o job.json`` joins them into one timeline, a process group per rank.

Memory: the events are kept in a ring of the last ``capacity`` (about 200 bytes each); the
file says how many were dropped. Nothing is recorded outside a trace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from asyncloader._base import tracing

__all__ = ["merge", "trace"]

#: The process id space of one rank in a merged trace (Linux pids stay below 2**22).
RANK_PIDS = 10_000_000


@contextlib.contextmanager
def trace(path: str | os.PathLike[str], *, capacity: int = tracing.CAPACITY) -> Iterator[Any]:
    """Records every loader of this process while the block runs, then writes ``path``.

    Args:
        path: Where to write the trace (JSON, the Chrome trace-event format).
        capacity: The most events kept: the last ones (a ring).

    Raises:
        RuntimeError: A trace is already active in this process.
    """
    if tracing.ACTIVE is not None:
        raise RuntimeError("asyncloader.trace: a trace is already active in this process")
    recorder = tracing.Recorder(tracing.TRAINING_PROCESS, capacity)
    tracing.ACTIVE = recorder
    try:
        yield recorder
    finally:
        tracing.ACTIVE = None
        tracing.write(recorder, path)


def merge(paths: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """The traces at ``paths`` (one per process of a job) as one: each rank a process group
    labelled ``rank R``, on one time axis.

    Clocks: a trace's times are its machine's monotonic clock; each file also holds that
    clock's offset to the wall clock when it was written, and the merge puts every event on
    the wall clock. On one machine that changes nothing between files; across machines the
    alignment is as good as their wall clocks agree (NTP: about a millisecond).
    """
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    # Each file's first time on the wall clock; an event's time in the merge is its distance
    # from its file's first plus that file's distance from the earliest file's (computed so
    # because wall-clock microseconds are too large for a float to add exactly).
    firsts = [
        min((e["ts"] for e in doc["traceEvents"] if "ts" in e), default=0.0) for doc in loaded
    ]
    starts = [
        first + doc.get("otherData", {}).get("wall_minus_clock_us", 0.0)
        for first, doc in zip(firsts, loaded, strict=True)
    ]
    origin = min(starts, default=0.0)
    events: list[dict[str, Any]] = []
    for k, doc in enumerate(loaded):
        rank = doc.get("otherData", {}).get("rank")
        rank = k if rank is None else rank
        shift = starts[k] - origin
        events += [_rebased(e, rank, firsts[k], shift) for e in doc["traceEvents"]]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _rebased(event: dict[str, Any], rank: int, first: float, shift: float) -> dict[str, Any]:
    """``event`` of rank ``rank``'s trace in the merged one: its process in the rank's range
    of ids and labelled with the rank, its time ``shift`` after its file's ``first``, its ids
    the rank's."""
    event = dict(event, pid=rank * RANK_PIDS + event.get("pid", 0) % RANK_PIDS)
    if "ts" in event:
        event["ts"] = (event["ts"] - first) + shift
    if event.get("ph") == "M" and event.get("name") == "process_name":
        event["args"] = {"name": f"rank {rank}: {event['args']['name']}"}
    elif event.get("ph") == "M" and event.get("name") == "process_sort_index":
        event["args"] = {"sort_index": event["pid"]}
    elif event.get("ph") in ("s", "f", "b", "e"):  # ids are per process group
        event["id"] = f"{rank}:{event.get('id')}"
    return event


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncloader.trace merge <dir or files> -o job.json``."""
    parser = argparse.ArgumentParser(prog="python -m asyncloader.trace", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    joining = commands.add_parser("merge", help="join the traces of a job's processes")
    joining.add_argument("inputs", nargs="+", help="trace files, or folders of them")
    joining.add_argument("-o", "--output", required=True, help="where to write the merged trace")
    args = parser.parse_args(argv)
    files: list[Path] = []
    for given in map(Path, args.inputs):
        files += sorted(given.glob("*.json")) if given.is_dir() else [given]
    if not files:
        parser.error("no trace files found in " + " ".join(args.inputs))
    Path(args.output).write_text(json.dumps(merge(files)))
    print(f"merged {len(files)} traces into {args.output}")
    return 0


class _CallableModule(types.ModuleType):
    """``asyncloader.trace(path)`` calls :func:`trace`; the module is also
    ``python -m asyncloader.trace``."""

    def __call__(self, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        return trace(path, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
