"""One workload through several loaders (or asyncloader from several source trees), side by
side: each run in a fresh process, loaders alternating, medians.

``python -m benchmarks.side_by_side WORKLOAD SETTING ITEMS LOADER... [--reps N] [--busy N]``

A loader is a name of :data:`benchmarks.loaders.BUILDERS`, optionally ``NAME@TREE`` to import
it from another checkout (``git worktree add /tmp/old a08f578``; run from this tree, whose
interpreter is used; the run imports the other tree's ``asyncloader`` and ``benchmarks``).
``--busy N`` keeps N busy-loop processes running beside the runs, to see
how the ranking holds on a loaded machine. Items/s over the epoch is what the benchmark's
targets use; the other columns are its other measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def run(loader: str, workload: str, setting: int, items: int) -> dict:
    """One fresh-process run of ``benchmarks.run_one``, in ``loader``'s tree."""
    name, _, tree = loader.partition("@")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.run_one", name, workload, str(setting), str(items)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree or HERE,
    )
    return json.loads(out.stdout)


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
        for _ in range(args.reps):
            for loader in args.loaders:
                runs[loader].append(run(loader, args.workload, args.setting, args.items))
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
