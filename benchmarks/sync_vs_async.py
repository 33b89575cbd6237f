"""io at high io_concurrency: asyncloader consumed with ``for`` (the sync wrapper: the loop in a
thread, batches handed to the consumer's thread) against ``async for`` (consumer on the loop).

Same source, checker and clock as the benchmark's io workload; each run in a fresh process,
the two alternating; medians. ``python -m benchmarks.sync_vs_async [--reps N] [--items N]
[--io-concurrency N]``
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

from benchmarks.checks import Checker
from benchmarks.workloads import IO_SHAPE, WORKLOADS, AsyncSleepSource


def one(mode: str, items: int, concurrency: int) -> float:
    """Items/s of one epoch consumed with ``for`` (mode "sync") or ``async for``."""
    from asyncloader import AsyncLoader

    checker = Checker(items, IO_SHAPE)
    loader = AsyncLoader(
        AsyncSleepSource(items), batch_size=WORKLOADS["io"].batch, io_concurrency=concurrency
    )
    gc.collect()
    t0 = time.perf_counter()
    if mode == "sync":
        with loader:
            for batch in loader:
                checker.add(batch)
    else:

        async def consume() -> None:
            async with loader:
                async for batch in loader:
                    checker.add(batch)

        import uvloop  # a core dependency; the loop the sync wrapper uses too

        uvloop.run(consume())
    wall = time.perf_counter() - t0
    checker.verify()
    return items / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--items", type=int, default=8192)
    parser.add_argument("--io-concurrency", type=int, default=1024)
    parser.add_argument("--one", choices=("sync", "async"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.items, args.io_concurrency)))
        return
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    for rep in range(args.reps):
        for mode in ("sync", "async") if rep % 2 == 0 else ("async", "sync"):
            cmd = [sys.executable, "-m", "benchmarks.sync_vs_async", "--one", mode]
            cmd += ["--items", str(args.items), "--io-concurrency", str(args.io_concurrency)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rates[mode].append(float(out.stdout.split()[-1]))
    for mode, values in rates.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{mode:5s} median {statistics.median(values):9,.0f} items/s  ({shown})")


if __name__ == "__main__":
    main()
