"""The most an event loop gets from the io workload: a bare program against asyncloader.

The bare program is ``N`` coroutines on uvloop reading the workload's own
:class:`~benchmarks.workloads.AsyncSleepSource` one index after another: no batches, no
collate, no checks, no second thread. It is the ceiling of any asyncio loader at ``N`` in
flight on this machine: below the nominal ``N / 20 ms`` because each ``asyncio.sleep(0.020)``
ends late (see :mod:`benchmarks.probes.sleep_precision`). asyncloader runs as in the benchmark
(:mod:`benchmarks.run_one`). Fresh processes, the two alternating; medians.

``python -m benchmarks.probes.io_ceiling [--reps N] [--items N] [--io-concurrency N]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from benchmarks import side_by_side
from benchmarks.workloads import LATENCY_S, AsyncSleepSource


async def _bare(items: int, concurrency: int) -> float:
    source = AsyncSleepSource(items)
    indices = iter(range(items))

    async def runner() -> None:
        for index in indices:
            await source[index]

    t0 = time.perf_counter()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return items / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--io-concurrency", type=int, default=64)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n, items = args.io_concurrency, args.items
    if args.bare:
        import uvloop

        print(json.dumps(uvloop.run(_bare(items, n))))
        return
    rates: dict[str, list[float]] = {"bare uvloop": [], "asyncloader": []}
    for _ in range(args.reps):
        rates["bare uvloop"].append(
            side_by_side.in_fresh_process(
                "benchmarks.probes.io_ceiling", "--bare", "--items", items, "--io-concurrency", n
            )
        )
        rates["asyncloader"].append(side_by_side.run("asyncloader", "io", n, items)["items_per_s"])
    limit = n / LATENCY_S
    print(f"io, {items} items, {n} in flight, {args.reps} fresh processes each (medians):")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"  {name:12s} {rate:7.0f} items/s = {rate / limit:.3f} of {limit:.0f}/s")


if __name__ == "__main__":
    main()
