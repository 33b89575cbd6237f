"""RayEngine against the local worker processes and against Ray Data.

Each run is a fresh process that starts its own Ray instance first when it needs one
(``ray.init(num_cpus=2)``, before the clock), then runs two epochs of one loader with
persistent workers: the first epoch includes starting the workers (processes, or actors),
the second is the steady state. Every delivered batch is checked
(:class:`benchmarks.checks.Checker`). Loaders:

- ``cpu``, the benchmark's cpu workload (1024-float samples in memory, a ~1.5 ms pure-Python
  ``transform``, batches of 32): ``local pool`` is ``num_workers=2``; ``ray`` is
  ``engine=RayEngine(2)`` (its actors, on this machine, answer over Unix sockets); ``ray via
  store`` is ``RayEngine(2, local_sockets=False)`` (through Ray's calls and object store, as
  actors on other nodes answer); ``ray data`` is ``ray.data.range(n).map_batches(...)``
  making and burning the same samples, read with ``iter_torch_batches(batch_size=32)``.
- ``io``, 20 ms per sample (``async def __getitem__``), ``io_concurrency=1024``, batches of 32:
  ``local pool`` is ``num_workers=2, fetch_in_workers=True``; ``ray`` and ``ray via store``
  as for cpu; ``ray data`` maps batches of ``ray.data.range(n)`` through 2 actors whose async
  ``__call__`` awaits a batch's samples together, each actor running up to 16 batches at
  once (``max_concurrency``: the same 1,024 samples in flight) on half a CPU (with a whole
  one each, the range's read tasks find no CPU and the dataset never starts), read with
  ``iter_torch_batches``.

Besides samples/s, each run reports the CPU its steady epoch cost per batch (psutil, over this
process and every process it started): the training process (loader and consumer), the
workers (local processes or asyncloader's actors), and the rest of what Ray runs (its
daemons, and Ray Data's actors).

``python -m benchmarks.probes.ray_engine [--reps 3] [--save [SECTION]] [--batch N] [--only io]
[--prefetch N] [--io-concurrency N] [--items N]`` (``--batch`` replaces the workloads' batch
size, ``--items`` their number of samples; ``--only`` runs one workload's cases; ``--prefetch``
fixes asyncloader's ``prefetch``, "auto" by default; ``--io-concurrency`` replaces the io
workload's 1024 samples in flight, in every case).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from benchmarks import side_by_side
from benchmarks import side_by_side as summaries

CASES = {
    "cpu": ("local pool", "ray", "ray via store", "ray data"),
    "io": ("local pool", "ray", "ray via store", "ray data"),
}
IO_IN_FLIGHT = 1024
ITEMS = {"cpu": 4000, "io": 40_000}
KEYS = ("first_epoch", "steady", "cpu_training", "cpu_workers", "cpu_ray")
ROLES = ("training", "workers", "ray")


def _role_of(kind: str) -> Any:
    """Which of :data:`ROLES` a process plays: this one ``training``; ``workers`` the local
    pool's processes, or asyncloader's Ray actors; ``ray`` the rest of what Ray started (its
    daemons, idle workers and Ray Data's actors)."""
    me = os.getpid()

    def role(process: Any, command: str) -> str:
        if process.pid == me:
            return "training"
        return "workers" if kind == "local pool" or "RayWorker" in command else "ray"

    return role


def _asyncloader(
    workload: str, kind: str, items: int, batch: int, prefetch: int = 0, in_flight: int = 0
) -> Any:
    from asyncloader import AsyncLoader
    from benchmarks.workloads import AsyncSleepSource, MemorySource, burn

    if workload == "cpu":
        dataset, options = MemorySource(items), {"transform": burn}
    else:
        dataset, options = AsyncSleepSource(items), {"io_concurrency": in_flight or IO_IN_FLIGHT}
    if prefetch:
        options["prefetch"] = prefetch
    if kind in ("ray", "ray via store"):  # ("ray data" is not an asyncloader)
        from asyncloader.ray import RayEngine

        options["engine"] = RayEngine(2, local_sockets=kind == "ray")
    else:
        options["num_workers"] = 2
        options["fetch_in_workers"] = workload == "io"
    return AsyncLoader(dataset, batch_size=batch, persistent_workers=True, **options)


class _Fetch:
    """Ray Data's form of the io workload: an actor whose async ``__call__`` awaits a batch's
    samples at once (``AsyncSleepSource``'s 20 ms each), many batches at a time."""

    def __init__(self, items: int) -> None:
        from benchmarks.workloads import AsyncSleepSource

        self.source = AsyncSleepSource(items)

    async def __call__(self, batch: dict[str, Any]) -> Any:
        import asyncio

        import numpy as np

        samples = await asyncio.gather(*(self.source[int(i)] for i in batch["id"]))
        yield {"x": np.stack(samples)}


def _ray_data_epochs(workload: str, items: int, batch: int, in_flight: int = 0) -> Any:
    import numpy as np
    import ray

    from benchmarks.checks import make_sample
    from benchmarks.workloads import CPU_SHAPE, burn

    def make(batch: dict[str, Any]) -> dict[str, Any]:
        return {"x": np.stack([burn(make_sample(int(i), CPU_SHAPE)) for i in batch["id"]])}

    if workload == "io":
        # 2 actors, as many batches in flight as 1024 samples make. Half a CPU each: with one
        # each, the 2-CPU cluster has none left for the range's read tasks and never starts.
        dataset = ray.data.range(items).map_batches(
            _Fetch,
            batch_size=batch,
            compute=ray.data.ActorPoolStrategy(size=2),
            num_cpus=0.5,
            fn_constructor_args=(items,),
            max_concurrency=max(1, (in_flight or IO_IN_FLIGHT) // batch // 2),
        )
    else:
        dataset = ray.data.range(items).map_batches(make, batch_size=batch)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return lambda: (b["x"] for b in dataset.iter_torch_batches(batch_size=batch))


def _one(
    workload: str, kind: str, batch: int, prefetch: int = 0, in_flight: int = 0, items: int = 0
) -> dict:
    from benchmarks.checks import Checker
    from benchmarks.workloads import WORKLOADS

    items, batch = items or ITEMS[workload], batch or WORKLOADS[workload].batch
    if kind != "local pool":
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    epochs: list[float] = []
    if kind == "ray data":
        epoch_of = _ray_data_epochs(workload, items, batch, in_flight)
        close = lambda: None  # noqa: E731
    else:
        loader = _asyncloader(workload, kind, items, batch, prefetch, in_flight)
        epoch_of, close = (lambda: iter(loader)), loader.close
    from benchmarks.run_one import cpu_between, cpu_by_role

    batches, role = items / batch, _role_of(kind)
    for _ in range(2):
        checker = Checker(items, WORKLOADS[workload].shape)
        cpu0 = cpu_by_role(role)
        t0 = time.perf_counter()
        for got in epoch_of():
            checker.add(got)
        epochs.append(items / (time.perf_counter() - t0))
        cpu = cpu_between(cpu0, cpu_by_role(role))
        checker.verify()
    close()
    per_batch = {f"cpu_{r}": cpu.get(r, 0.0) / batches * 1000 for r in ROLES}  # the steady epoch's
    return {"first_epoch": epochs[0], "steady": epochs[1], **per_batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    summaries.add_save_argument(parser, "ray_engine")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--only", choices=sorted(CASES))
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--io-concurrency", type=int, default=0)
    parser.add_argument("--items", type=int, default=0)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        got = _one(*args.one, args.batch, args.prefetch, args.io_concurrency, args.items)
        print(json.dumps(got))
        return
    chosen = [args.only] if args.only else list(CASES)
    runs = {(w, k): [] for w in chosen for k in CASES[w]}
    for _ in range(args.reps):
        for workload, kind in runs:
            one = ("benchmarks.probes.ray_engine", "--one", workload, kind)
            one += ("--batch", args.batch, "--prefetch", args.prefetch, "--items", args.items)
            one += ("--io-concurrency", args.io_concurrency)
            runs[workload, kind].append(side_by_side.in_fresh_process(*one))
    medians = {
        f"{w}/{k}": {key: statistics.median(r[key] for r in rs) for key in KEYS}
        for (w, k), rs in runs.items()
    }
    print(f"samples/s, {args.reps} fresh processes each, alternating (medians)")
    print(f"  {'case':16s} {'first epoch':>11s} {'steady':>9s} {'ratio (steady)':>14s}")
    for name, m in medians.items():
        base = medians[name.split("/")[0] + "/local pool"]["steady"]
        print(
            f"  {name:16s} {m['first_epoch']:11.0f} {m['steady']:9.0f} {m['steady'] / base:14.2f}"
        )
    print("CPU ms per batch in the steady epoch (medians): training process, workers, rest of Ray")
    for name, m in medians.items():
        print(f"  {name:16s} " + " ".join(f"{m[f'cpu_{r}']:6.3f}" for r in ROLES))
    if args.save:
        items = {w: args.items or n for w, n in ITEMS.items()}
        summaries.save(args.save, {"items": items, "medians": medians})


if __name__ == "__main__":
    main()
