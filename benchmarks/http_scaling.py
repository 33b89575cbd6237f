"""Throughput of HTTPSource behind a 20 ms server as io_concurrency grows.

``python benchmarks/http_scaling.py [--latency 0.02] [--size 65536] [--runs 3]``

A local HTTP server (its own process, 127.0.0.1, free port) waits ``latency`` before each
response; AsyncLoader reads ``items`` bodies through HTTPSource with batches of 32 for each
``io_concurrency``, ``runs`` times, and prints the median items/s next to the ideal
``io_concurrency / latency``. On a small machine the server and the client share the cores,
so the curve flattens where CPU, not latency, becomes the limit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from latency_server import LatencyServer

from asyncloader import AsyncLoader
from asyncloader.sources import HTTPSource


def items_per_second(urls: list[str], io_concurrency: int) -> float:
    """One epoch over ``urls`` (a new event loop and connection pool, as each epoch has)."""
    loader = AsyncLoader(
        HTTPSource(urls), batch_size=32, io_concurrency=io_concurrency, collate_fn=list
    )
    start = time.perf_counter()
    n = sum(len(batch) for batch in loader)
    assert n == len(urls)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=0.020)
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per body")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    args = parser.parse_args()
    print(f"{args.size} B bodies, {args.latency * 1e3:.0f} ms latency, median of {args.runs}")
    print(f"{'io_concurrency':>14} {'items':>6} {'items/s':>9} {'ideal':>9} {'of ideal':>9}")
    with LatencyServer((4000, args.size), latency=args.latency) as server:
        all_urls = server.urls()
        for level in args.levels:
            ideal = level / args.latency
            n = int(min(len(all_urls), max(100, ideal * 1.5)))  # ~1.5 s of ideal work
            rates = [items_per_second(all_urls[:n], level) for _ in range(args.runs)]
            rate = statistics.median(rates)
            print(f"{level:>14} {n:>6} {rate:>9,.0f} {ideal:>9,.0f} {rate / ideal:>9.0%}")


if __name__ == "__main__":
    main()
