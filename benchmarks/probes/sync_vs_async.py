"""io at high io_concurrency: asyncloader consumed with ``for`` (the sync wrapper: the loop in a
thread, batches handed to the consumer's thread) against ``async for`` (consumer on the loop).

``for`` is the benchmark's own run (:func:`benchmarks.run_one.run`); ``async for`` reads the
same source into the same checker, with the same loader options and the clock started before
the loader is built and stopped at its last batch. Each run in a fresh process, the two
alternating; medians. ``python -m benchmarks.probes.sync_vs_async [--reps N] [--items N]
[--io-concurrency N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks.loaders import asyncloader_options
from benchmarks.run_one import prepare, run
from benchmarks.side_by_side import in_fresh_process


def one(mode: str, items: int, concurrency: int) -> float:
    """Items/s of one epoch consumed with ``for`` (mode "sync") or ``async for``."""
    if mode == "sync":
        return run("asyncloader", "io", concurrency, items, None)["items_per_s"]
    import uvloop  # a core dependency; the loop the sync wrapper uses too

    from asyncloader import AsyncLoader

    workload, checker, dataset = prepare("asyncloader", "io", items, None)

    async def consume() -> float:
        t0 = time.perf_counter()
        loader = AsyncLoader(dataset, **asyncloader_options(workload, concurrency))
        async with loader:
            async for batch in loader:
                checker.add(batch)
            return time.perf_counter() - t0

    wall = uvloop.run(consume())
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
            rates[mode].append(
                in_fresh_process(
                    "benchmarks.probes.sync_vs_async",
                    *("--one", mode, "--items", args.items),
                    *("--io-concurrency", args.io_concurrency),
                )
            )
    for mode, values in rates.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{mode:5s} median {statistics.median(values):9,.0f} items/s  ({shown})")


if __name__ == "__main__":
    main()
