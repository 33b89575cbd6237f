"""Where the http workload's rate at 64 in flight is bounded: one event loop, or the loader.

``python -m benchmarks.probes.http_loops [--items 4000] [--reps 5] [--only CASE...] [--save]``

The http workload (:func:`benchmarks.workloads.http_server`, 20 ms per response, 64 KiB
bodies) read 64 requests at a time, every case in a fresh process, cases alternating, one
server for the whole run:

- ``client, 1 loop``: no loader, the benchmark's own async client
  (:class:`~benchmarks.workloads.AsyncHttpSource`) awaited by 64 tasks on one uvloop loop:
  what any loader that awaits this source on one loop can reach at most;
- ``client, 2 loops``: the same 64 split over two threads of this process, each with its own
  loop, client and 32 tasks;
- ``asyncloader``: ``AsyncLoader(io_concurrency=64)``, as in the benchmark;
- ``asyncloader, fetch_in_workers``: the same with ``num_workers=2, fetch_in_workers=True``
  (each worker's loop fetches 32 at a time);
- ``torchdata``: torchdata.nodes with 64 threads over the blocking client, as in the
  benchmark.

It prints items/s (over the epoch, from building the loader or starting the tasks to the
last item), the CPU of the measured process tree per item, and each case's per-round ratio to
torchdata. For the clients without a loader it also prints the median time from writing a
request to having its whole response (``p50_ms``; 20.7 ms with one request in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
import warnings

from benchmarks.side_by_side import add_save_argument, in_fresh_process, save
from benchmarks.workloads import AsyncHttpSource, http_server

IN_FLIGHT = 64
CASES = (
    "client, 1 loop",
    "client, 2 loops",
    "asyncloader",
    "asyncloader, fetch_in_workers",
    "torchdata",
)


async def _read_all(port: int, indices: list[int], tasks: int, took: list[float]) -> None:
    """Reads ``indices`` with ``tasks`` tasks on this thread's loop, each one at a time."""
    source, todo = AsyncHttpSource(len(indices), port), iter(indices)

    async def reader() -> None:
        for index in todo:
            began = time.perf_counter()
            await source[index]
            took.append(time.perf_counter() - began)

    await asyncio.gather(*(reader() for _ in range(tasks)))
    source.close()


def client(port: int, items: int, loops: int) -> dict:
    """The client without a loader: ``items`` responses over ``loops`` threads' loops."""
    import uvloop

    took: list[float] = []
    threads = [
        threading.Thread(
            target=uvloop.run,
            args=(_read_all(port, list(range(k, items, loops)), IN_FLIGHT // loops, took),),
        )
        for k in range(loops)
    ]
    began, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    return {
        "items_per_s": items / wall,
        "cpu_ms_per_item": (time.process_time() - cpu) * 1e3 / items,
        "p50_ms": statistics.median(took) * 1e3,
    }


def loader(port: int, items: int, name: str, options: dict) -> dict:
    """One epoch of a benchmark loader, measured as the benchmark measures it."""
    from benchmarks.loaders import BUILDERS
    from benchmarks.run_one import measure, prepare

    workload, checker, dataset = prepare(name, "http", items, port)
    timings = measure(BUILDERS[name](workload, dataset, IN_FLIGHT, **options), checker)
    return {key: timings[key] for key in ("items_per_s", "cpu_ms_per_item")}


def one(case: str, port: int, items: int) -> dict:
    """Case ``case``, in this process."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    if case.startswith("client"):
        return client(port, items, loops=int(case.split(", ")[1][0]))
    if case == "torchdata":
        return loader(port, items, "torchdata", {})
    options = {"num_workers": 2, "fetch_in_workers": True} if "workers" in case else {}
    return loader(port, items, "asyncloader", options)


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Medians of each case, and its per-round ratio to torchdata (median and range)."""
    summary = {}
    anchor = runs.get("torchdata")
    for case, results in runs.items():
        row = {
            key: round(statistics.median(r[key] for r in results), 3)
            for key in results[0]
            if key in ("items_per_s", "cpu_ms_per_item", "p50_ms")
        }
        if anchor is not None and case != "torchdata":
            pairs = zip(results, anchor, strict=True)
            ratios = [mine["items_per_s"] / theirs["items_per_s"] for mine, theirs in pairs]
            row["x_torchdata"] = round(statistics.median(ratios), 3)
            row["x_torchdata_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        summary[case] = {**row, "runs": [round(r["items_per_s"]) for r in results]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--one", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    add_save_argument(parser, "http_loops")
    args = parser.parse_args()
    if args.one:
        sys.stdout.write(json.dumps(one(args.one, args.port, args.items)) + "\n")
        return
    runs: dict[str, list[dict]] = {case: [] for case in args.only}
    with http_server(args.items) as server:
        for _ in range(args.reps):
            for case in args.only:
                one_case = ("--one", case, "--port", server.port, "--items", args.items)
                runs[case].append(
                    in_fresh_process("benchmarks.probes.http_loops", *one_case, timeout_s=300)
                )
    summary = summarise(runs)
    print(f"http, {IN_FLIGHT} in flight, {args.items} items, medians of {args.reps}")
    for case, row in summary.items():
        print(f"{case:32s} {json.dumps(row)}")
    if args.save:
        save(args.save, {"items": args.items, "reps": args.reps, "cases": summary})


if __name__ == "__main__":
    main()
