"""Where one epoch's CPU goes: the main process against each worker process, with page faults.

``python -m benchmarks.probes.process_split LOADER WORKLOAD SETTING ITEMS [--reps N]``: each rep
in a fresh process, set up as the benchmark's run (:func:`benchmarks.run_one.prepare`, the
loader of :data:`benchmarks.loaders.BUILDERS`; the http workload's server runs beside it);
CPU seconds and minor page faults of the main process and of every child process, counted
from the first batch (worker start-up excluded) to the last batch, or for a child to its last
reading after a batch while it was alive; and the main process's voluntary context switches.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
from typing import Any

import psutil

from benchmarks.loaders import BUILDERS
from benchmarks.run_one import case_arguments, prepare
from benchmarks.side_by_side import in_fresh_process
from benchmarks.workloads import http_server


def _children() -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds, minor faults) of every live descendant."""
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
            with open(f"/proc/{proc.pid}/stat") as f:
                minflt = int(f.read().rpartition(")")[2].split()[7])
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
        out[proc.pid] = (times.user + times.system, minflt)
    return out


def _main_usage() -> tuple[float, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt, r.ru_nvcsw


def one(
    loader: str, workload_name: str, setting: int, items: int, port: int | None
) -> dict[str, Any]:
    """Consumes one epoch; returns the main process's and each child's share."""
    workload, checker, dataset = prepare(loader, workload_name, items, port)
    with BUILDERS[loader](workload, dataset, setting) as batches:
        it = iter(batches)
        checker.add(next(it))
        main0, kids0 = _main_usage(), _children()
        kids1 = dict(kids0)
        for batch in it:
            checker.add(batch)
            # Each process's last reading while alive: a pool may exit before the consumer has
            # taken the last batches (asyncloader's does once it has made them all).
            kids1.update(_children())
        main1 = _main_usage()
    checker.verify()
    return {
        "main_cpu_s": main1[0] - main0[0],
        "main_minflt": main1[1] - main0[1],
        "main_voluntary_switches": main1[2] - main0[2],
        "children": [
            {"cpu_s": kids1[pid][0] - cpu, "minflt": kids1[pid][1] - flt}
            for pid, (cpu, flt) in kids0.items()
            if pid in kids1
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    case_arguments(parser)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    case = (args.loader, args.workload, args.setting, args.items)
    if args.one:
        print(json.dumps(one(*case, args.port)))
        return
    with contextlib.ExitStack() as stack:
        port: list[object] = []
        if args.workload == "http":
            port = ["--port", stack.enter_context(http_server(args.items)).port]
        for _ in range(args.reps):
            r = in_fresh_process("benchmarks.probes.process_split", *case, "--one", *port)
            kids = ", ".join(f"{c['cpu_s']:.2f} s / {c['minflt']} faults" for c in r["children"])
            print(
                f"main {r['main_cpu_s']:.2f} s / {r['main_minflt']} faults / "
                f"{r['main_voluntary_switches']} switches; children: {kids or 'none'}"
            )


if __name__ == "__main__":
    main()
