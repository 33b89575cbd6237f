"""How long ``await asyncio.sleep(0.020)`` really takes, on uvloop and on asyncio's own loop.

The io workload's async flavour waits with ``asyncio.sleep``; its blocking flavour with
``time.sleep``. An event loop's timers fire late by a fraction of a millisecond (uvloop, like
libuv, keeps time in whole milliseconds), so each 20 ms wave of requests lasts 20.3-20.7 ms
here, which caps any asyncio loader below the workload's nominal 3,200/s at 64 in flight.

``python -m benchmarks.probes.sleep_precision [--waits N]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.workloads import LATENCY_S


async def _waits(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await asyncio.sleep(LATENCY_S)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waits", type=int, default=50)
    args = parser.parse_args()
    loops = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop

        loops["uvloop"] = uvloop.new_event_loop
    except ImportError:
        pass
    blocking = []
    for _ in range(args.waits):
        t = time.perf_counter()
        time.sleep(LATENCY_S)
        blocking.append(time.perf_counter() - t)
    print(f"time.sleep({LATENCY_S}): median {statistics.median(blocking) * 1e3:.2f} ms")
    for name, new_loop in loops.items():
        loop = new_loop()
        try:
            waits = loop.run_until_complete(_waits(args.waits))
        finally:
            loop.close()
        print(f"{name} asyncio.sleep({LATENCY_S}): median {statistics.median(waits) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
