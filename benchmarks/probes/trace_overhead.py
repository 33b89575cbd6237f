"""What tracing costs: the loader without the trace hooks, with them and no trace active, and
inside ``asyncloader.trace``; and the size of a trace per 1,000 batches.

Workloads (:mod:`benchmarks.workloads`, the harness's settings):

- ``overhead``: 200,000 samples whose ``__getitem__`` returns the index, batch 64, 2
  workers: what is left is the loader's own cost per batch, where hooks show most;
- ``io@1024``: 50,000 samples of 20 ms each awaited on the loop, batch 32,
  ``io_concurrency=1024``.

Cases per workload: ``before`` (the package as of ``--before REV``, checked out in a
worktree: no hooks at all), ``off`` (this tree, no trace active) and ``on`` (this tree, the
epoch inside ``asyncloader.trace``). The rate is the epoch's; writing the trace file at the
block's end is timed apart (``write_s``), a cost paid once per trace. Each run is a fresh
process; the cases alternate within a round; medians of ``--reps`` rounds, and per-round
ratios against ``before`` and ``off``.

``python -m benchmarks.probes.trace_overhead [--reps 5] [--before REV] [--save [SECTION]]
[--toy]``; ``--toy``: one round of ``off`` and ``on``, to check that the probe still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import side_by_side

MODULE = "benchmarks.probes.trace_overhead"
ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = {"overhead": 2, "io": 1024}  # workload -> the harness's setting for asyncloader
#: Samples per run: epochs of 2-3 s (the harness's 40,000 and 2,000 take 0.5 s and 0.1 s here,
#: too short to tell a few percent on this machine).
ITEMS = {"overhead": 200_000, "io": 50_000}
CASES = [f"{w} {c}" for w in WORKLOADS for c in ("before", "off", "on")]


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` beside this one (made once, kept)."""
    where = Path(tempfile.gettempdir()) / f"asyncloader-at-{rev}"
    if not where.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-f", str(where), rev],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
    return where


def one(case: str, before: str) -> dict[str, Any]:
    """One epoch of ``case`` in this process."""
    name, kind = case.split()
    if kind == "before":
        sys.path.insert(0, str(worktree(before)))  # its asyncloader, this tree's harness
    import asyncloader
    from benchmarks.loaders import asyncloader_loader, make_dataset
    from benchmarks.workloads import WORKLOADS as ALL

    assert kind != "before" or not hasattr(asyncloader, "trace"), "the worktree has hooks"
    workload, setting = ALL[name], WORKLOADS[name]
    items = ITEMS[name]
    dataset = make_dataset("asyncloader", workload, items, None)
    path = Path(tempfile.mkdtemp()) / "trace.json"
    tracing = asyncloader.trace(path) if kind == "on" else contextlib.nullcontext()
    with tracing:
        t0, batches = time.perf_counter(), 0
        with asyncloader_loader(workload, dataset, setting) as it:
            for _ in it:
                batches += 1
        wall = time.perf_counter() - t0
    written = time.perf_counter() - t0 - wall  # the trace file, once, at the block's end
    result = {"items_per_s": items / wall, "wall_s": wall, "batches": batches}
    if kind == "on":
        document = json.loads(path.read_text())
        size = path.stat().st_size
        result |= {
            "write_s": written,
            "trace_bytes_per_1000_batches": size * 1000 / batches,
            "events": len(document["traceEvents"]),
            "dropped": document["otherData"]["dropped"],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--before", default="a80421a", help="a revision without the hooks")
    side_by_side.add_save_argument(parser, "trace_overhead")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--toy", action="store_true", help="one round, no 'before'")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.before)))
        return
    cases = [c for c in CASES if not c.endswith("before")] if args.toy else CASES
    if args.toy:
        args.reps = 1
    else:
        worktree(args.before)
    runs = side_by_side.rounds(
        cases, args.reps,
        lambda c: side_by_side.in_fresh_process(MODULE, "--one", c, "--before", args.before),
        snake=True,
    )  # fmt: skip
    keys = ("items_per_s", "write_s", "trace_bytes_per_1000_batches", "events")
    medians = side_by_side.medians(runs, keys)
    table = {}
    for case in cases:
        name = case.split()[0]
        row = dict(medians[case])
        row["vs before"] = side_by_side.paired(runs, f"{name} before").get(case)
        row["vs off"] = side_by_side.paired(runs, f"{name} off").get(case)
        table[case] = row
        print(case.ljust(14), json.dumps(row))
    if args.save:
        side_by_side.save(args.save, {"reps": args.reps, "before": args.before, "cases": table})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
