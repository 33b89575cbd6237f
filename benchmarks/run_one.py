"""Runs one (loader, workload, setting) in this fresh process and prints its result as JSON.

``python -m benchmarks.run_one LOADER WORKLOAD SETTING ITEMS [--port PORT]``. The loader's
library is imported and the heap collected first (:func:`benchmarks.loaders.import_library`,
``gc.collect()``); the clock starts
just before the loader is built and stops at its last batch; every batch is checked
(:mod:`benchmarks.checks`) and a wrong delivery exits non-zero. CPU seconds are those of this
process and all its descendants, live or already reaped by a member of the tree, between
just before the build and just after the loader closed. Peak memory is sampled from outside
by the driver (:mod:`benchmarks.bench`), which does not share this process's GIL.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import psutil

from benchmarks.checks import Checker
from benchmarks.loaders import BUILDERS, import_library, make_dataset
from benchmarks.workloads import WORKLOADS, Workload

clock = time.perf_counter  # the run's clock (a test simulates it)


def tree_cpu_seconds() -> float:
    """User + system seconds of this process and its descendants, reaped ones included.

    A process that exited and was reaped by a member of the tree is in that member's
    ``children_user``/``children_system``; a live one counts in its own times.
    """
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):  # microsecond resolution
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def cpu_by_role(role_of: Callable[[psutil.Process, str], str | None]) -> dict[int, Any]:
    """User + system seconds so far of this process and of each descendant, by process id,
    with the role ``role_of(process, its command line)`` gives it (``None``: not counted)."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times, command = proc.cpu_times(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if (role := role_of(proc, command)) is not None:
            out[proc.pid] = (role, times.user + times.system)
    return out


def cpu_between(before: dict[int, Any], after: dict[int, Any]) -> dict[str, float]:
    """CPU seconds by role between two :func:`cpu_by_role` (of the processes in both: one
    that started or ended between them is left out)."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        if pid in before:
            spent[role] = spent.get(role, 0.0) + seconds - before[pid][1]
    return spent


def prepare(
    loader: str, workload_name: str, items: int, port: int | None
) -> tuple[Workload, Checker, Any]:
    """Everything done before the clock starts: the data, the checker, the library imported
    and the heap collected. Returns ``(workload, checker, dataset)``."""
    workload = WORKLOADS[workload_name]
    checker = Checker(items, workload.shape)
    dataset = make_dataset(loader, workload, items, port)
    import_library(loader)
    # Start every loader from a collected heap. Importing torch leaves a large young heap, so
    # the first full collection of the process (~70 ms here) otherwise lands in whichever
    # loader allocates enough first: a one-off of the process, not a cost of the epoch.
    gc.collect()
    return workload, checker, dataset


def measure(loader: AbstractContextManager[Iterable[Any]], checker: Checker) -> dict[str, Any]:
    """Consumes one epoch of ``loader``, checked by ``checker``; returns its timings.

    The clock starts just before ``loader`` is entered (which builds the loader: a builder of
    :data:`benchmarks.loaders.BUILDERS` builds nothing until then) and stops at the last batch;
    closing is timed apart. ``stall_fraction`` is the share of the time after the first batch
    that the consumer (the check) spent waiting in ``next()``. Raises
    :class:`~benchmarks.checks.DeliveryError` on a wrong delivery.
    """
    items = checker.n
    cpu0 = tree_cpu_seconds()
    t0 = clock()
    waited = 0.0
    with loader as batches:
        it = iter(batches)
        first = checker.add(next(it))
        t_first = asked = clock()
        for batch in it:
            waited += clock() - asked
            checker.add(batch)
            asked = clock()
        t_end = clock()
        waited += t_end - asked  # the last next(), which ended the epoch
    t_closed = clock()
    cpu = tree_cpu_seconds() - cpu0
    checker.verify()
    wall = t_end - t0
    return {
        "items_per_s": items / wall,
        "steady_items_per_s": (items - first) / (t_end - t_first) if items > first else None,
        "ttfb_s": t_first - t0,
        "wall_s": wall,
        "close_s": t_closed - t_end,
        "stall_fraction": waited / (t_end - t_first) if t_end > t_first else None,
        "cpu_s": cpu,
        "cpu_ms_per_item": cpu * 1e3 / items,
    }


def run(
    loader: str, workload_name: str, setting: int, items: int, port: int | None, **options: Any
) -> dict:
    """Builds the loader, consumes one epoch, checks it; returns the measurements.

    ``options`` go to the loader's builder (only asyncloader's takes any: AsyncLoader options).
    """
    workload, checker, dataset = prepare(loader, workload_name, items, port)
    timings = measure(BUILDERS[loader](workload, dataset, setting, **options), checker)
    return {
        "loader": loader,
        "workload": workload_name,
        "setting": setting,
        "setting_name": "num_workers" if _is_workers(loader, workload) else "io_concurrency",
        "items": items,
        "batch": workload.batch,
        **timings,
        "self_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "check": {"ok": True, **checker.summary()},
    }


def _is_workers(loader: str, workload) -> bool:
    """Whether the setting counts processes (else requests in flight)."""
    return loader == "DataLoader" or not workload.latency_bound


def case_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the arguments that name one run: ``LOADER WORKLOAD SETTING ITEMS``."""
    parser.add_argument("loader", choices=sorted(BUILDERS))
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("setting", type=int)
    parser.add_argument("items", type=int)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    case_arguments(parser)
    parser.add_argument("--port", type=int, help="the http workload's server")
    args = parser.parse_args()
    # http samples are np.frombuffer views of the response bytes, read-only for every loader.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run(args.loader, args.workload, args.setting, args.items, args.port)
    result["pid"] = os.getpid()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
