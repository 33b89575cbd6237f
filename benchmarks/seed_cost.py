"""Cost of ``seed_per_sample`` on DESIGN.md's ``cpu`` workload (2000 items, batch 32, 2 workers).

Runs each setting in a fresh process, alternating, ``--reps`` times, and prints the median
items/s of each and their ratio: ``python benchmarks/seed_cost.py [--reps 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

ITEMS, BATCH, WORK = 2000, 32, 12_000  # WORK: loop length giving ~1.5 ms of pure Python


class CpuBound:
    """Items in memory; each costs ~1.5 ms of pure-Python work (GIL held)."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> np.ndarray:
        acc = 0
        for i in range(WORK):
            acc += i * i % 7
        return np.full(16, (index + acc) % 256, dtype=np.uint8)


def one_run(seeded: bool) -> float:
    import torch

    from asyncloader import AsyncLoader

    loader = AsyncLoader(
        CpuBound(),
        batch_size=BATCH,
        num_workers=2,
        seed_per_sample=seeded,
        generator=torch.Generator().manual_seed(0),
    )
    start, seen = time.perf_counter(), 0
    for batch in loader:
        seen += len(batch)
    assert seen == ITEMS
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", choices=["plain", "seeded"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child == "seeded")))
        return
    rates: dict[str, list[float]] = {"plain": [], "seeded": []}
    for _ in range(args.reps):
        for name in rates:
            out = subprocess.run(
                [sys.executable, __file__, "--child", name],
                capture_output=True,
                text=True,
                check=True,
            )
            rates[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain, seeded = (statistics.median(rates[k]) for k in ("plain", "seeded"))
    for name, key in (("False", "plain"), ("True ", "seeded")):
        median = statistics.median(rates[key])
        print(
            f"seed_per_sample={name}: {median:7.0f} items/s  runs: {[round(r) for r in rates[key]]}"
        )
    print(f"ratio seeded/plain: {seeded / plain:.3f}")


if __name__ == "__main__":
    main()
