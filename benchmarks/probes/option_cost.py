"""What one AsyncLoader option costs on a benchmark workload, side by side with it off.

Variants:

- ``seed_per_sample``: the ``cpu`` workload (2000 items, batch 32, 2 workers, ~1.5 ms of pure
  Python per sample) with ``seed_per_sample`` off and on, a seeded ``generator`` both ways.
- ``distributed``: the ``overhead`` workload (40000 bare indices, batch 64, 2 workers: what is
  left is the loader's own cost) as one rank, and as rank 0 of a world of 1 with
  ``distributed=True`` (the loader's rank sampler, epoch bookkeeping and elastic state).

Each run is the benchmark's own asyncloader run (:func:`benchmarks.run_one.run`, every batch
checked) in a fresh process, the two alternating, ``--reps`` times; prints the median items/s
of each and their ratio: ``python -m benchmarks.probes.option_cost VARIANT [--reps 5]
[--items N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.loaders import CPU_WORKERS
from benchmarks.run_one import run
from benchmarks.side_by_side import in_fresh_process
from benchmarks.workloads import WORKLOADS

#: variant -> (workload, options with it on); off is the same without them
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "seed_per_sample": ("cpu", {"seed_per_sample": True}),
    "distributed": ("overhead", {"distributed": True, "rank": 0, "world_size": 1}),
}


def one_run(variant: str, on: bool, items: int) -> float:
    """Items/s of one epoch over the whole epoch, as the benchmark counts it."""
    import torch

    workload, options = VARIANTS[variant]
    generator = torch.Generator().manual_seed(0)
    result = run(
        "asyncloader", workload, CPU_WORKERS, items, None, generator=generator,
        **(options if on else {}),
    )  # fmt: skip
    return result["items_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    workload, options = VARIANTS[args.variant]
    items = args.items or WORKLOADS[workload].items
    if args.child:
        print(json.dumps(one_run(args.variant, args.child == "on", items)))
        return
    rates: dict[str, list[float]] = {"off": [], "on": []}
    child = ["benchmarks.probes.option_cost", args.variant, "--items", items, "--child"]
    for _ in range(args.reps):
        for name in rates:
            rates[name].append(in_fresh_process(*child, name))
    for name in rates:
        runs = [round(r) for r in rates[name]]
        print(f"{args.variant} {name:3}: {statistics.median(rates[name]):8.0f} items/s  {runs=}")
    on, off = (statistics.median(rates[k]) for k in ("on", "off"))
    print(f"{workload}: ratio on/off {on / off:.3f}  ({options})")


if __name__ == "__main__":
    main()
