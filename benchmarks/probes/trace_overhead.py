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

The no-trace cost is a few percent at most at these rates, below what fresh processes on this
machine resolve, so it is also bounded from its parts (``hooks``, in this process): the hook
calls an ``overhead`` batch makes (counted over an epoch on the loop and the loader's threads,
plus the :data:`WORKER_HOOKS` of a batch made in a worker), each hook's time with no trace
active (``timeit``), and so the hooks' time per batch against the batch's time.

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


#: Hook calls of a batch made in a worker that a batch made in the training process does not
#: make: ``worker_recording`` and ``with_events`` in the worker, ``absorb`` twice on return,
#: and the read of ``ACTIVE`` for the request's trace flag.
WORKER_HOOKS = {"worker_recording": 1, "with_events": 1, "absorb": 2, "ACTIVE": 1}
#: How each hook is called in the timing, with no trace active.
HOOK_CALLS = {
    "span": "with tracing.span('collate', 3, 64): pass",
    "instant": "tracing.instant('skip', 'failure', None)",
    "counter": "tracing.counter('batches', values)",
    "begin": "tracing.begin('engine', 'batch', 3)",
    "end": "tracing.end('engine', 'batch', 3)",
    "flow": "tracing.flow('s', 3)",
    "stream_flows": "tracing.stream_flows(0, 2)",
    "alias": "tracing.alias(3, 4)",
    "absorb": "tracing.absorb(values)",
    "worker_recording": "tracing.worker_recording(False, str)",
    "with_events": "tracing.with_events(values)",
    "clock": "tracing.clock()",
    "waited": "tracing.waited(0.0, 3)",
    "ACTIVE": "tracing.ACTIVE is not None",
}


def hook_cost(items: int = 40_000) -> dict[str, Any]:
    """The hooks' time per ``overhead`` batch with no trace active, from their calls per batch
    (counted) and each call's time (``timeit``, best of 5)."""
    import timeit

    from asyncloader._base import tracing
    from benchmarks.loaders import asyncloader_loader, make_dataset
    from benchmarks.workloads import WORKLOADS as ALL

    calls = dict.fromkeys(HOOK_CALLS, 0)

    def counted(name: str, hook: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return hook(*args, **kwargs)

        return call

    originals = {name: getattr(tracing, name) for name in HOOK_CALLS if name != "ACTIVE"}
    for name, hook in originals.items():
        setattr(tracing, name, counted(name, hook))
    try:
        workload = ALL["overhead"]
        dataset = make_dataset("asyncloader", workload, items, None)
        batches = 0
        with asyncloader_loader(workload, dataset, 0) as it:
            for _ in it:
                batches += 1
    finally:
        for name, hook in originals.items():
            setattr(tracing, name, hook)
    per_batch = {name: calls[name] / batches + WORKER_HOOKS.get(name, 0) for name in calls}
    namespace = {"tracing": tracing, "values": {"ahead": 1}}
    each_ns = {
        name: min(timeit.repeat(code, number=100_000, repeat=5, globals=namespace)) * 1e4
        for name, code in HOOK_CALLS.items()
    }
    return {
        "calls_per_batch": {n: round(c, 2) for n, c in per_batch.items() if c},
        "ns_per_call": {n: round(t, 1) for n, t in each_ns.items()},
        "hooks_us_per_batch": sum(per_batch[n] * each_ns[n] for n in HOOK_CALLS) / 1e3,
    }


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
    hooks = hook_cost(4_000 if args.toy else 40_000)
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
    # the bound: the rate without hooks is at most the batch's time less theirs
    from benchmarks.workloads import WORKLOADS as ALL

    batch_us = ALL["overhead"].batch * 1e6 / medians["overhead off"]["items_per_s"]
    hooks["no_trace_bound"] = (batch_us - hooks["hooks_us_per_batch"]) / batch_us
    print("hooks, no trace", json.dumps(hooks))
    if args.save:
        side_by_side.save(
            args.save, {"reps": args.reps, "before": args.before, "cases": table, "hooks": hooks}
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
