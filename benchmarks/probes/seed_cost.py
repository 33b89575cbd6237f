"""Cost of ``seed_per_sample`` on the benchmark's ``cpu`` workload (2000 items, batch 32,
2 workers, ~1.5 ms of pure Python per sample).

Each setting is the benchmark's own asyncloader run (:func:`benchmarks.run_one.run`) with
``seed_per_sample`` off or on and a seeded ``generator``, in a fresh process, alternating,
``--reps`` times; prints the median items/s of each and their ratio:
``python -m benchmarks.probes.seed_cost [--reps 5] [--items 2000]``.
"""

from __future__ import annotations

import argparse
import json
import statistics

from benchmarks.loaders import CPU_WORKERS
from benchmarks.run_one import run
from benchmarks.side_by_side import in_fresh_process
from benchmarks.workloads import WORKLOADS


def one_run(seeded: bool, items: int) -> float:
    """Items/s of one epoch over the whole epoch, as the benchmark counts it."""
    import torch

    generator = torch.Generator().manual_seed(0)
    result = run(
        "asyncloader", "cpu", CPU_WORKERS, items, None, seed_per_sample=seeded, generator=generator
    )
    return result["items_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--items", type=int, default=WORKLOADS["cpu"].items)
    parser.add_argument("--child", choices=["plain", "seeded"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child == "seeded", args.items)))
        return
    rates: dict[str, list[float]] = {"plain": [], "seeded": []}
    for _ in range(args.reps):
        for name in rates:
            rates[name].append(
                in_fresh_process(
                    "benchmarks.probes.seed_cost", "--child", name, "--items", args.items
                )
            )
    plain, seeded = (statistics.median(rates[k]) for k in ("plain", "seeded"))
    for name, key in (("False", "plain"), ("True ", "seeded")):
        median = statistics.median(rates[key])
        print(
            f"seed_per_sample={name}: {median:7.0f} items/s  runs: {[round(r) for r in rates[key]]}"
        )
    print(f"ratio seeded/plain: {seeded / plain:.3f}")


if __name__ == "__main__":
    main()
