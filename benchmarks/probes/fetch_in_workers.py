"""Fetch on one loop or in the workers: the io workload at a high in-flight count.

The benchmark's io workload (``async def __getitem__`` answering after 20 ms, batches of 32)
with ``io_concurrency`` samples in flight, through three placements of asyncloader:

- ``loop, 0 workers``: every fetch and collate on the training process's event loop (the
  benchmark's io configuration);
- ``loop, 2 workers``: fetches on that loop, collate in 2 worker processes;
- ``in workers, 2``: ``fetch_in_workers=True``, each of the 2 workers fetching half the
  samples in flight on its own event loop and collating them.

Each run is a fresh process, the placements alternating; medians. Reported: samples/s (and as
a fraction of the ``io_concurrency / 20 ms`` the latency allows), the ratio to ``loop, 2
workers``, and CPU per sample of the training process alone and of all its processes.

``python -m benchmarks.probes.fetch_in_workers [--reps 3] [--items 200000]
[--io-concurrency 4096] [--save [SECTION]]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from benchmarks import side_by_side
from benchmarks import side_by_side as summaries
from benchmarks.workloads import LATENCY_S

PLACEMENTS = {
    "loop, 0 workers": {},
    "loop, 2 workers": {"num_workers": 2},
    "in workers, 2": {"num_workers": 2, "fetch_in_workers": True},
}
BASELINE = "loop, 2 workers"


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _one(placement: str, items: int, io_concurrency: int) -> dict:
    """One epoch in this process, timed as benchmarks.run_one times it."""
    from benchmarks.loaders import asyncloader_loader
    from benchmarks.run_one import measure, prepare

    workload, checker, dataset = prepare("asyncloader", "io", items, None)
    options = PLACEMENTS[placement]
    loader = asyncloader_loader(workload, dataset, io_concurrency, **options)
    cpu0 = _self_cpu()
    t0 = time.perf_counter()
    timings = measure(loader, checker)
    return {
        **timings,
        "self_cpu_ms_per_item": (_self_cpu() - cpu0) * 1e3 / items,
        "self_wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--io-concurrency", type=int, default=4096)
    summaries.add_save_argument(parser, "fetch_in_workers")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.items, args.io_concurrency)))
        return
    runs: dict[str, list[dict]] = {name: [] for name in PLACEMENTS}
    for _ in range(args.reps):
        for name in PLACEMENTS:
            runs[name].append(
                side_by_side.in_fresh_process(
                    "benchmarks.probes.fetch_in_workers", "--one", name, "--items", args.items,
                    "--io-concurrency", args.io_concurrency,
                )
            )  # fmt: skip
    limit = args.io_concurrency / LATENCY_S
    medians = {
        name: {
            key: statistics.median(r[key] for r in rs)
            for key in ("items_per_s", "cpu_ms_per_item", "self_cpu_ms_per_item")
        }
        for name, rs in runs.items()
    }
    base = medians[BASELINE]
    print(
        f"io, 20 ms, {args.items} items, io_concurrency={args.io_concurrency}, "
        f"{args.reps} fresh processes each, alternating (medians):"
    )
    print(
        f"  {'placement':17s} {'samples/s':>9s} {'of limit':>8s} {'ratio':>6s} "
        f"{'train-proc CPU ms/sample':>24s} {'all-proc CPU ms/sample':>22s}"
    )
    for name, m in medians.items():
        print(
            f"  {name:17s} {m['items_per_s']:9.0f} {m['items_per_s'] / limit:8.2f} "
            f"{m['items_per_s'] / base['items_per_s']:6.2f} "
            f"{m['self_cpu_ms_per_item']:24.4f} {m['cpu_ms_per_item']:22.4f}"
        )
    if args.save:
        summaries.save(
            args.save,
            {"items": args.items, "io_concurrency": args.io_concurrency, "medians": medians},
        )


if __name__ == "__main__":
    main()
