"""One workload through several loaders (or asyncloader from several source trees), side by
side: each run in a fresh process, loaders alternating, medians.

``python -m benchmarks.side_by_side WORKLOAD SETTING ITEMS LOADER... [--reps N] [--busy N]``

A loader is a name of :data:`benchmarks.loaders.BUILDERS`, optionally ``NAME@TREE`` to import
it from another checkout (``git worktree add /tmp/old a08f578``; run from this tree, whose
interpreter is used; the run imports the other tree's ``asyncloader`` and ``benchmarks``).
``--busy N`` keeps N busy-loop processes running beside the runs, to see
how the ranking holds on a loaded machine. Items/s over the epoch is what the benchmark's
targets use; the other columns are its other measurements. The http workload's server runs
for the whole comparison, as in the benchmark.

:func:`in_fresh_process` is how the probes (:mod:`benchmarks.probes`) run each measurement in
a process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.workloads import http_server

ROOT = Path(__file__).resolve().parent.parent


def in_fresh_process(module: str, *args: object, cwd: Path | str = ROOT) -> Any:
    """Runs ``python -m module args...`` in ``cwd``; returns its last line of output, as JSON.

    Raises ``subprocess.CalledProcessError`` (with its stderr) if it exits non-zero.
    """
    out = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(loader: str, workload: str, setting: int, items: int, port: int | None = None) -> dict:
    """One fresh-process run of ``benchmarks.run_one``, in ``loader``'s tree; ``port`` is the
    http workload's server's."""
    name, _, tree = loader.partition("@")
    args: list[object] = [name, workload, setting, items]
    if port is not None:
        args += ["--port", port]
    return in_fresh_process("benchmarks.run_one", *args, cwd=tree or ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("setting", type=int)
    parser.add_argument("items", type=int)
    parser.add_argument("loaders", nargs="+")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: dict[str, list[dict]] = {loader: [] for loader in args.loaders}
    try:
        with contextlib.ExitStack() as stack:
            port = None
            if args.workload == "http":
                port = stack.enter_context(http_server(args.items)).port
            for _ in range(args.reps):
                for loader in args.loaders:
                    runs[loader].append(run(loader, args.workload, args.setting, args.items, port))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"{args.workload} {args.setting} {args.items} items, {args.reps} runs each, medians")
    print("loader                          items/s   steady   first s   CPU s")
    for loader, results in runs.items():
        items, steady, first, cpu = (
            statistics.median(r[key] for r in results)
            for key in ("items_per_s", "steady_items_per_s", "ttfb_s", "cpu_s")
        )
        print(f"{loader:30s} {items:8.0f} {steady:8.0f} {first:9.3f} {cpu:7.2f}")
    print("load average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
