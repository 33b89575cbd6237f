"""Throughput of asyncloader's ``HTTPSource`` behind a 20 ms server as io_concurrency grows.

``python -m benchmarks.probes.http_scaling [--latency 0.02] [--runs 3] [--levels 1 4 16 ...]
[--workers N [--fetch-in-workers]]``

The http workload's server (:func:`benchmarks.workloads.http_server`: its own process,
127.0.0.1, a free port, the workload's 64 KiB samples) waits ``latency`` before each response;
AsyncLoader reads ``items`` bodies through ``HTTPSource`` in the workload's batches of 32 for
each ``io_concurrency``, ``runs`` times, every delivery checked and timed as the benchmark's
(:func:`benchmarks.run_one.measure`), and prints the median items/s next to the ideal
``io_concurrency / latency``. On a small machine the server and the client share the cores,
so the curve flattens where CPU, not latency, becomes the limit. With ``--workers N`` the
loader has N workers (collating), and with ``--fetch-in-workers`` they fetch too, each with its
own connection pool; the CPU per object of this (the training) process is printed too.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import warnings

import numpy as np

from benchmarks.checks import Checker
from benchmarks.run_one import measure
from benchmarks.workloads import HTTP_SHAPE, LATENCY_S, WORKLOADS, http_server

MAX_ITEMS = 4000


def _array(body: bytes) -> np.ndarray:
    return np.frombuffer(body, dtype=np.uint8)


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def items_per_second(urls: list[str], io_concurrency: int, **options: object) -> tuple:
    """One epoch over ``urls`` (a new event loop and connection pool, as each epoch has):
    ``(items/s, CPU ms per item of this process)``."""
    from asyncloader import AsyncLoader
    from asyncloader.sources import HTTPSource

    loader = AsyncLoader(
        HTTPSource(urls, decode=_array),
        batch_size=WORKLOADS["http"].batch,
        io_concurrency=io_concurrency,
        **options,
    )
    cpu0 = _self_cpu()
    rate = measure(loader, Checker(len(urls), HTTP_SHAPE))["items_per_s"]
    return rate, (_self_cpu() - cpu0) * 1e3 / len(urls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=LATENCY_S)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--fetch-in-workers", action="store_true")
    args = parser.parse_args()
    options = {"num_workers": args.workers, "fetch_in_workers": args.fetch_in_workers}
    # The samples are np.frombuffer views of the response bytes, read-only.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    print(f"{HTTP_SHAPE[0]} B bodies, {args.latency * 1e3:.0f} ms latency, median of {args.runs}")
    print(f"{options}")
    print(
        f"{'io_concurrency':>14} {'items':>6} {'items/s':>9} {'ideal':>9} {'of ideal':>9} "
        f"{'this process CPU ms/item':>24}"
    )
    with http_server(MAX_ITEMS, latency=args.latency) as server:
        all_urls = server.urls()
        for level in args.levels:
            ideal = level / args.latency
            n = int(min(len(all_urls), max(100, ideal * 1.5)))  # ~1.5 s of ideal work
            runs = [items_per_second(all_urls[:n], level, **options) for _ in range(args.runs)]
            rate = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            print(
                f"{level:>14} {n:>6} {rate:>9,.0f} {ideal:>9,.0f} {rate / ideal:>9.0%} {cpu:>24.3f}"
            )


if __name__ == "__main__":
    main()
