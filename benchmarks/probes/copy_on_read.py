"""Copy-on-read: the PSS of each of 4 forked workers at the start, the middle
and the end of an epoch over a list of 1M small dicts, DataLoader against AsyncLoader, and with
the remedies: the records in an ``asyncloader.SharedList``, or ``gc.freeze()`` before the fork.

A forked worker shares the training process's pages until it writes to one; reading a Python
object writes its reference count, so a worker that reads a list of dicts copies, page by
page, the part of it that it reads (PyTorch issue 13246). A SharedList holds the records
pickled in one byte array: reading one writes nothing to it.

Datasets (map-style ``torch`` Datasets, built in the training process before the loader):

- ``dicts``: :class:`benchmarks.probes.inmemory.DictsDataset`, a list of 1,000,000 dicts
  ``{"id": i, "label": i % 10, "text": f"sample {i}"}``; item ``i`` is ``(id, label)``.
- ``SharedList``: the same dicts in a ``SharedList``, built from a generator (the list of
  dicts never exists); item ``i`` is ``(id, label)``.
- ``no data``: items ``(i, i % 10)`` computed from ``i``, for what a worker's PSS is
  without a dataset to copy (the interpreter, torch, the loader's own memory).
- ``dicts + gc.freeze``: ``dicts``, with ``gc.freeze()`` called just before ``iter()``, so
  that the workers' collections never walk (and write the headers of) the inherited objects.

Loaders, the same arguments for both: ``batch_size=256, shuffle=True, num_workers=4,
persistent_workers=True`` (so that the workers are still there, all records read, when the
epoch's last batch has arrived), the default start method (fork). One full epoch: every
record is read once, by one of the workers. Every batch is checked (labels are ``id % 10``)
and the epoch must deliver each id once.

Each run is a fresh process (``--one``). "One copy of the data" is how much the process's
USS (``psutil``'s ``memory_full_info().uss``, its private pages) grew while it built the
dataset. Each worker's PSS (``memory_full_info().pss``, from ``/proc/PID/smaps_rollup``: a page
shared by k processes counts 1/k in each) is read by the training process after the first
batch (start), after batch ``len // 2`` (middle) and after the last (end). The 4 workers'
PSS at the end, summed, against one copy of the data, is the issue's target (at most 1.5x
with the remedy). Rows alternate run by run; the table shows medians over ``--reps`` rounds
(a worker's PSS: the median over runs of the mean over the 4 workers).

``python -m benchmarks.probes.copy_on_read [--reps 5] [--only ROW ...]``; results in
docs/benchmarks.md and docs/workers.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import side_by_side as summaries
from benchmarks.probes.inmemory import BATCH, DICTS, DictsDataset, _check

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
#: (loader, data) of each row, in the order of a round.
ROWS = (
    ("DataLoader", "no data"),
    ("AsyncLoader", "no data"),
    ("DataLoader", "dicts"),
    ("AsyncLoader", "dicts"),
    ("AsyncLoader", "dicts + gc.freeze"),
    ("AsyncLoader", "SharedList"),
    ("DataLoader", "SharedList"),
)
NAMES = tuple(f"{loader}/{data}" for loader, data in ROWS)
RUN_TIMEOUT_S = 900
POINTS = ("start", "mid", "end")
clock = time.perf_counter


class NoData(Dataset):
    """1M items computed from their index: item i is (i, i % 10)."""

    def __len__(self) -> int:
        return DICTS

    def __getitem__(self, i: int) -> Any:
        return i, i % 10


class SharedDicts(Dataset):
    """The dicts of :class:`DictsDataset` in a SharedList; item i is (id, label)."""

    def __init__(self) -> None:
        from asyncloader import SharedList

        self.rows = SharedList(
            {"id": i, "label": i % 10, "text": f"sample {i}"} for i in range(DICTS)
        )

    def __len__(self) -> int:
        return DICTS

    def __getitem__(self, i: int) -> Any:
        row = self.rows[i]
        return row["id"], row["label"]


def _workers_pss() -> list[int]:
    """The PSS of each of this process's worker processes, in the order of their pids."""
    workers = sorted(psutil.Process().children(recursive=True), key=lambda p: p.pid)
    if len(workers) != WORKERS:
        raise AssertionError(f"{len(workers)} worker processes, not {WORKERS}")
    return [p.memory_full_info().pss for p in workers]


def _one(loader_name: str, data: str) -> dict[str, Any]:
    """One run in this fresh process: build, one epoch, the workers' PSS along it."""
    from asyncloader import AsyncLoader

    me = psutil.Process()
    gc.collect()
    uss0 = me.memory_full_info().uss
    t = clock()
    kinds = {"SharedList": SharedDicts, "no data": NoData}
    dataset = kinds.get(data, DictsDataset)()
    build_s = clock() - t
    gc.collect()
    data_bytes = me.memory_full_info().uss - uss0
    options: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": WORKERS}
    cls: Any = DataLoader if loader_name == "DataLoader" else AsyncLoader
    loader = cls(dataset, persistent_workers=True, **options)
    if data.endswith("gc.freeze"):
        gc.freeze()
    pss: dict[str, list[int]] = {}
    t = clock()
    it: Any = iter(loader)
    seen = [_check("dicts", next(it))]
    pss["start"] = _workers_pss()
    for n, batch in enumerate(it, 2):
        seen.append(_check("dicts", batch))
        if n == len(loader) // 2:
            pss["mid"] = _workers_pss()
    epoch_s = clock() - t
    pss["end"] = _workers_pss()
    main_end = me.memory_full_info().pss
    ids = np.concatenate(seen)
    if len(ids) != DICTS or len(np.unique(ids)) != DICTS:
        raise AssertionError("the epoch did not deliver every id once")
    if isinstance(loader, AsyncLoader):
        loader.close()
    else:
        it._shutdown_workers()  # DataLoader's persistent workers
    return {
        "data_bytes": data_bytes,
        "shared_list_nbytes": getattr(getattr(dataset, "rows", None), "nbytes", None),
        "pss": pss,
        "main_end_pss": main_end,
        "build_s": build_s,
        "epoch_s": epoch_s,
        "torch": torch.__version__,
    }


def run(loader: str, data: str) -> dict[str, Any]:
    """One fresh-process run."""
    cmd = [sys.executable, "-m", "benchmarks.probes.copy_on_read", "--one", loader, data]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, timeout=RUN_TIMEOUT_S, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{loader} {data} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over runs, in MB or GB: a worker's PSS (mean of 4) at each point, the 4 summed
    at the end, one copy of the data, the training process's PSS at the end."""
    mb, gb = 2**20, 2**30
    out = {
        f"worker_{p}_mb": statistics.median(statistics.mean(r["pss"][p]) / mb for r in runs)
        for p in POINTS
    }
    out["workers_end_gb"] = statistics.median(sum(r["pss"]["end"]) / gb for r in runs)
    out["worker_end_min_mb"] = statistics.median(min(r["pss"]["end"]) / mb for r in runs)
    out["worker_end_max_mb"] = statistics.median(max(r["pss"]["end"]) / mb for r in runs)
    out["data_gb"] = statistics.median(r["data_bytes"] / gb for r in runs)
    out["main_end_gb"] = statistics.median(r["main_end_pss"] / gb for r in runs)
    out["epoch_s"] = statistics.median(r["epoch_s"] for r in runs)
    out["build_s"] = statistics.median(r["build_s"] for r in runs)
    return out


def table(med: dict[tuple[str, str], dict[str, float]], reps: int) -> str:
    """The rows against one copy of the list of dicts (the ``dicts`` rows' median), and what
    the data adds to the workers: their PSS above the same loader's ``no data`` row."""
    copies = [m["data_gb"] for (_, data), m in med.items() if data == "dicts"]
    dicts_gb = statistics.median(copies) if copies else float("nan")
    lines = [
        f"One epoch of {DICTS:,} records, batch {BATCH}, shuffle, {WORKERS} forked persistent "
        f"workers; medians of {reps} fresh processes per row, rows alternating. One copy of "
        f"the list of dicts: {dicts_gb:.3f} GB.",
        "",
        "| loader | data | one copy (GB) | worker PSS start (MB) | mid (MB) | end (MB) "
        "| end, min-max (MB) | 4 workers at end (GB) | x one copy of the dicts "
        "| 4 workers above no data (GB) | x own copy | training process at end (GB) "
        "| epoch (s) |",
        "|---|---|" + "---:|" * 11,
    ]
    for (loader, data), m in med.items():
        bare = med.get((loader, "no data"))
        above = m["workers_end_gb"] - bare["workers_end_gb"] if bare else float("nan")
        own = f"{above / m['data_gb']:.2f}" if data != "no data" else "-"
        lines.append(
            f"| {loader} | {data} | {m['data_gb']:.3f} | {m['worker_start_mb']:.0f} "
            f"| {m['worker_mid_mb']:.0f} | {m['worker_end_mb']:.0f} "
            f"| {m['worker_end_min_mb']:.0f}-{m['worker_end_max_mb']:.0f} "
            f"| {m['workers_end_gb']:.3f} | {m['workers_end_gb'] / dicts_gb:.2f} "
            f"| {above:.3f} | {own} | {m['main_end_gb']:.3f} | {m['epoch_s']:.1f} |"
        )
    return "\n".join(lines)


def rounds(rows: list[tuple[str, str]], reps: int) -> dict[tuple[str, str], list[dict]]:
    """``reps`` rounds of one fresh run per row, each run reported as it ends."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {row: [] for row in rows}
    for rep in range(reps):
        for loader, data in rows:
            r = run(loader, data)
            runs[loader, data].append(r)
            print(
                f"round {rep + 1}, {loader}, {data}: one copy {r['data_bytes'] / 2**30:.3f} GB, "
                + ", ".join(
                    f"{p} " + "/".join(f"{x / 2**20:.0f}" for x in r["pss"][p]) for p in POINTS
                )
                + f" MB, epoch {r['epoch_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=NAMES, help="rows to run (all by default)")
    summaries.add_save_argument(parser, "copy_on_read")
    parser.add_argument("--one", nargs=2, metavar=("LOADER", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # run from the module by its name, so that workers can import what it pickles
        from benchmarks.probes import copy_on_read

        print(json.dumps(copy_on_read._one(*args.one)))
        return
    rows = [row for row in ROWS if "/".join(row) in (args.only or NAMES)]
    load_before = os.getloadavg()
    runs = rounds(rows, args.reps)
    med = {row: medians(rs) for row, rs in runs.items()}
    text = table(med, args.reps)
    load_after = os.getloadavg()
    print(text)
    print("\nload average before/after:", *(f"{x:.2f}" for x in (*load_before, *load_after)))
    if args.save:
        summaries.save(
            args.save,
            {
                "config": {
                    "records": DICTS,
                    "batch": BATCH,
                    "num_workers": WORKERS,
                    "reps": args.reps,
                    "cpus": os.cpu_count(),
                    "load1_before_after": [load_before[0], load_after[0]],
                },
                "medians": {f"{loader}/{data}": m for (loader, data), m in med.items()},
                "table": text,
            },
        )


if __name__ == "__main__":
    main()
