"""Steady-state items/s on DESIGN.md's ``overhead`` workload: DataLoader vs AsyncLoader.

40,000 int items, batches of 64, 2 workers; each loader in a fresh process, alternating,
``--reps`` times; items/s counted from the first batch on (start-up excluded, so the number
shows the per-batch cost of moving batches out of the workers):
``python benchmarks/overhead_steady.py [--reps 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

ITEMS, BATCH = 40_000, 64


class Ints:
    """``__getitem__`` returns the index: the loader's own cost is all there is."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> int:
        return index


def one_run(kind: str) -> float:
    if kind == "DataLoader":
        from torch.utils.data import DataLoader

        loader = DataLoader(Ints(), batch_size=BATCH, num_workers=2)
    else:
        from asyncloader import AsyncLoader

        loader = AsyncLoader(Ints(), batch_size=BATCH, num_workers=2)
    first, seen, total = None, 0, 0
    for batch in loader:
        total += int(batch.sum())
        if first is None:
            first = time.perf_counter()
        else:
            seen += len(batch)
    assert total == ITEMS * (ITEMS - 1) // 2, "every item exactly once"
    return seen / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child)))
        return
    rates: dict[str, list[float]] = {"DataLoader": [], "AsyncLoader": []}
    for _ in range(args.reps):
        for kind in rates:
            cmd = [sys.executable, __file__, "--child", kind]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rates[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(rates["DataLoader"])
    for kind, runs in rates.items():
        median = statistics.median(runs)
        shown = [round(r) for r in runs]
        print(f"{kind:<12} {median:9.0f} items/s  x{median / base:.2f}  runs {shown}")


if __name__ == "__main__":
    main()
