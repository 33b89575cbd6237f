"""Large in-memory datasets: time to the first batch of epochs 1 and 2 and
the peak memory of the whole process tree, DataLoader against AsyncLoader, 2 workers.

Datasets, built in the training process before the loader (map-style ``torch`` Datasets):

- ``array``: one 1 GiB ``uint8`` numpy array of 262,144 rows of 4 KiB (every page written);
  item ``i`` is row ``i``, a 4 KiB view, collated into ``uint8 [256, 4096]`` batches.
- ``dicts``: a list of 1,000,000 small dicts ``{"id": i, "label": i % 10, "text": f"sample
  {i}"}``; item ``i`` is ``(id, label)``, collated into two ``int64 [256]`` tensors.

Loaders, the same arguments for both: ``batch_size=256, shuffle=True, num_workers=2,
persistent_workers=False`` (DataLoader's fastest sensible setup here: workers forked at each
``iter()``, sharing the dataset's pages), the default start method (fork on Linux before
Python 3.14). ``AsyncLoader forkserver`` (dicts only; ``--no-variant`` leaves it out) adds
``mp_context="forkserver"``: the dataset is pickled into every worker at every epoch, to show
what that costs.

Each run is a fresh process (``--one``): it imports torch, numpy and asyncloader, builds the
dataset and collects the heap, builds the loader, then runs ``--epochs`` epochs (2) of
``--batches`` batches each (50: 12,800 samples; the iterator is then closed, as a ``break``
would, and the close timed apart). With ``--epochs`` above 2 the table adds the median, per
run, of the first batch of epochs 2..N. Time to first batch: from just before ``iter()`` to
the first batch. At the end of each epoch, before closing, the run reads its tree's summed
PSS and the processes in it (its descendants: the workers, and for forkserver the fork server
and the resource tracker too). Every batch is checked (size, dtype, values those of the
indices delivered), each epoch's indices must be distinct, and the first two epochs' orders
must differ (the shuffle).

Each cell runs twice a round, in two fresh processes: the times come from the first, left
alone; the memory from the second. Reading a process's smaps takes the lock of its memory
map, which its ``fork()`` and its page faults then wait for: sampling delayed the first
batches by 9-14 ms (medians of 5 rounds; ``sampled_ttfb*_s`` keep the sampled run's times).
Peak memory is sampled from outside, by this (the harness) process, which shares no GIL with
the run: every 25 ms, the PSS (``psutil.Process.memory_full_info().pss``, from
``/proc/PID/smaps_rollup``) of the run's process and of all its descendants (their list
refreshed every 100 ms), summed; the peak is the largest sum, dataset building included.
PSS divides every shared page between the processes that map it, so the sum over the tree
counts the dataset's pages once however many workers share them, and a copy (pickled into a
worker, or a page a worker wrote to) as often as it exists. Pages shared with processes
outside the tree (libtorch's, with other Python processes on the machine) count only in part.

Loaders alternate run by run (DataLoader, AsyncLoader, the variant, for each dataset, then
the next round); the table shows medians over ``--reps`` rounds, and AsyncLoader's over
DataLoader's medians.

``python -m benchmarks.probes.inmemory [--reps 3] [--batches 50] [--epochs 2]
[--only array|dicts] [--no-variant] [--save [SECTION]]``; results in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import side_by_side as summaries
from benchmarks.side_by_side import in_fresh_process, in_fresh_process_sampled

BATCH = 256
WORKERS = 2
ROW = 4096  # bytes per array item
ROWS = 2**30 // ROW  # 1 GiB
DICTS = 1_000_000
DATASETS = ("array", "dicts")
REFERENCE = "DataLoader"
LOADERS = ("DataLoader", "AsyncLoader")
VARIANT = "AsyncLoader forkserver"  # dicts only
SAMPLE_EVERY_S = 0.025
RUN_TIMEOUT_S = 300
KEYS = (
    "ttfb1_s",
    "ttfb2_s",
    "sampled_ttfb1_s",
    "sampled_ttfb2_s",
    "ttfb_later_s",
    "peak_pss_gb",
    "end_pss_gb",
    "iter1_s",
    "iter2_s",
    "epoch1_s",
    "epoch2_s",
    "build_s",
)
clock = time.perf_counter


class ArrayDataset(Dataset):
    """One 1 GiB uint8 array; item i is row i (4 KiB), whose first 8 bytes hold i."""

    def __init__(self) -> None:
        self.data = np.empty((ROWS, ROW), dtype=np.uint8)
        self.data[:] = np.arange(ROW, dtype=np.uint64).astype(np.uint8)  # every page
        self.data[:, :8] = np.arange(ROWS, dtype="<u8")[:, None].view(np.uint8)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> Any:
        return self.data[i]


class DictsDataset(Dataset):
    """A list of 1M small dicts; item i is (id, label)."""

    def __init__(self) -> None:
        self.rows = [{"id": i, "label": i % 10, "text": f"sample {i}"} for i in range(DICTS)]

    def __len__(self) -> int:
        return DICTS

    def __getitem__(self, i: int) -> Any:
        row = self.rows[i]
        return row["id"], row["label"]


def _check(kind: str, batch: Any) -> Any:
    """The indices of a checked batch (a wrong batch raises)."""
    if kind == "array":
        rows = batch.numpy()
        if rows.dtype != np.uint8 or rows.shape[1] != ROW or len(rows) > BATCH:
            raise AssertionError(f"bad batch {rows.dtype} {rows.shape}")
        ids = np.ascontiguousarray(rows[:, :8]).view("<u8")[:, 0]
        if not (rows[:, 8:] == np.arange(8, ROW, dtype=np.uint64).astype(np.uint8)).all():
            raise AssertionError("bad row content")
        return ids
    ids, labels = (t.numpy() for t in batch)
    if len(ids) > BATCH or not (labels == ids % 10).all():
        raise AssertionError("bad (id, label) batch")
    return ids


def _tree_pss() -> tuple[int, list[str]]:
    """This process's and its descendants' summed PSS, and the descendants' names."""
    me = psutil.Process()
    total, names = 0, []
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_full_info().pss
            if proc.pid != me.pid:
                names.append(" ".join(proc.cmdline())[:80] or proc.name())
    return total, names


def _one(kind: str, loader_name: str, batches: int, epochs: int = 2) -> dict:
    """One run in this fresh process: build, ``epochs`` epochs, their timings and memory."""
    from asyncloader import AsyncLoader

    gc.collect()
    t = clock()
    dataset = ArrayDataset() if kind == "array" else DictsDataset()
    build_s = clock() - t
    gc.collect()
    options: dict[str, Any] = {
        "batch_size": BATCH,
        "shuffle": True,
        "num_workers": WORKERS,
        "persistent_workers": False,
    }
    if loader_name == VARIANT:
        options["mp_context"] = "forkserver"
    cls = DataLoader if loader_name == REFERENCE else AsyncLoader
    loader = cls(dataset, **options)
    result: dict[str, Any] = {"build_s": build_s, "pid": os.getpid()}
    orders, pids = [], set()
    for epoch in range(1, epochs + 1):
        seen = []
        t0 = clock()
        it = iter(loader)
        t_iter = clock()
        first = next(it)
        t_first = clock()
        seen.append(_check(kind, first))
        for _, batch in zip(range(batches - 1), it, strict=False):
            seen.append(_check(kind, batch))
        t_end = clock()
        pss, names = _tree_pss()
        kids = psutil.Process().children(recursive=True)
        pids.update(p.pid for p in kids)
        closing = getattr(it, "close", None) or it._shutdown_workers  # DataLoader's iterator
        closing()
        del it
        t_closed = clock()
        ids = np.concatenate(seen)
        if len(np.unique(ids)) != len(ids) or ids.max() >= len(dataset):
            raise AssertionError(f"epoch {epoch}: repeated or unknown indices")
        orders.append(ids)
        result.update(
            {
                f"ttfb{epoch}_s": t_first - t0,
                f"iter{epoch}_s": t_iter - t0,
                f"epoch{epoch}_s": t_end - t0,
                f"close{epoch}_s": t_closed - t_end,
                f"end{epoch}_pss_gb": pss / 2**30,
                f"processes{epoch}": len(kids),
                f"process_names{epoch}": names,
            }
        )
    if np.array_equal(orders[0], orders[1]):
        raise AssertionError("the first two epochs delivered the same order")
    result["end_pss_gb"] = result[f"end{epochs}_pss_gb"]
    result["processes"] = result[f"processes{epochs}"]
    result["ttfb_later_s"] = statistics.median(result[f"ttfb{e}_s"] for e in range(2, epochs + 1))
    result["distinct_processes"] = len(pids)
    result["samples_per_epoch"] = len(orders[1])
    result["torch"] = torch.__version__
    return result


def run_timed_then_sampled(kind: str, loader: str, batches: int, epochs: int = 2) -> dict:
    """Two fresh-process runs: the times from one left alone, the peak memory from one whose
    PSS is sampled from here (reading a process's smaps takes its memory map's lock, which
    its ``fork()`` and page faults then wait for)."""
    timed = run_sampled(kind, loader, batches, epochs, sample=False)
    sampled = run_sampled(kind, loader, batches, epochs)
    memory = {key: sampled[key] for key in sampled if "pss" in key or key.startswith("process")}
    return {
        **timed,
        **memory,
        "sampled_ttfb1_s": sampled["ttfb1_s"],
        "sampled_ttfb2_s": sampled["ttfb2_s"],
    }


def run_sampled(kind: str, loader: str, batches: int, epochs: int = 2, sample: bool = True) -> dict:
    """One fresh-process run, with its tree's peak summed PSS sampled from here (with
    ``sample``; else ``peak_*`` are 0)."""
    args = ("--one", kind, loader, "--batches", batches, "--epochs", epochs)
    if sample:
        return in_fresh_process_sampled(
            "benchmarks.probes.inmemory", *args, every_s=SAMPLE_EVERY_S, timeout_s=RUN_TIMEOUT_S
        )
    result = in_fresh_process("benchmarks.probes.inmemory", *args, timeout_s=RUN_TIMEOUT_S)
    result.update(peak_pss_gb=0.0, peak_main_pss_gb=0.0, peak_children_pss_gb=0.0)
    return result


def cells(only: list[str] | None, variant: bool) -> list[tuple[str, str]]:
    """(dataset, loader) in the order of a round."""
    out = []
    for kind in only or DATASETS:
        out += [(kind, loader) for loader in LOADERS]
        if variant and kind == "dicts":
            out.append((kind, VARIANT))
    return out


def medians(runs: dict[tuple[str, str], list[dict]]) -> dict[tuple[str, str], dict[str, float]]:
    return {
        cell: {key: statistics.median(r[key] for r in rs) for key in KEYS}
        for cell, rs in runs.items()
    }


def _ratio(med: dict, kind: str, loader: str, key: str) -> float | None:
    ref = med.get((kind, REFERENCE))
    return med[kind, loader][key] / ref[key] if ref else None


def table(runs: dict[tuple[str, str], list[dict]], reps: int, batches: int, epochs: int) -> str:
    med = medians(runs)
    later = epochs > 2
    lines = [
        f"{batches} batches of {BATCH} per epoch, {epochs} epochs, 2 workers, shuffle, "
        f"persistent_workers=False; medians of {reps} fresh processes per row, loaders "
        f"alternating; x DL: the median over DataLoader's median.",
        "",
        "| dataset | loader | first batch, epoch 1 (s) | x DL | first batch, epoch 2 (s) | x DL "
        + (f"| first batch, epochs 2-{epochs} (s) | x DL " if later else "")
        + f"| peak PSS (GB) | x DL | PSS end of epoch {epochs} (GB) | processes |",
        "|---|---|" + "---:|" * (10 if later else 8),
    ]

    def cell(kind: str, loader: str, key: str, digits: int) -> str:
        r = _ratio(med, kind, loader, key)
        return f"| {med[kind, loader][key]:.{digits}f} | {'-' if r is None else f'{r:.2f}'} "

    for (kind, loader), m in med.items():
        procs = sorted({r["processes"] for r in runs[kind, loader]})
        lines.append(
            f"| {kind} | {loader} "
            + cell(kind, loader, "ttfb1_s", 3)
            + cell(kind, loader, "ttfb2_s", 3)
            + (cell(kind, loader, "ttfb_later_s", 3) if later else "")
            + cell(kind, loader, "peak_pss_gb", 2)
            + f"| {m['end_pss_gb']:.2f} | {'/'.join(map(str, procs))} |"
        )
    return "\n".join(lines)


def paired(runs: dict[tuple[str, str], list[dict]], epochs: int) -> dict[str, dict[str, list]]:
    """Per round, each loader's first-batch times over DataLoader's of the same round (run
    just before or after it): ``{"dataset/loader": {key: [lowest, median, highest]}}``."""
    keys = ["ttfb1_s", "ttfb2_s"] + (["ttfb_later_s"] if epochs > 2 else [])
    out: dict[str, dict[str, list]] = {}
    for (kind, loader), rs in runs.items():
        ref = runs.get((kind, REFERENCE))
        if loader == REFERENCE or not ref:
            continue
        out[f"{kind}/{loader}"] = {
            key: [
                f(r[key] / b[key] for r, b in zip(rs, ref, strict=False))
                for f in (min, statistics.median, max)
            ]
            for key in keys
        }
    return out


def paired_text(ratios: dict[str, dict[str, list]]) -> str:
    lines = ["", "Per round (x DL of the same round; median, lowest-highest):"]
    for name, by_key in ratios.items():
        cells = ", ".join(
            f"{key[:-2]} {m:.2f} ({lo:.2f}-{hi:.2f})" for key, (lo, m, hi) in by_key.items()
        )
        lines.append(f"  {name}: {cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=50, help="batches per epoch")
    parser.add_argument(
        "--epochs",
        type=int,
        default=2,
        help="epochs per run (at least 2); above 2, the table adds the median first batch "
        "of epochs 2..N",
    )
    parser.add_argument("--only", nargs="+", choices=DATASETS)
    parser.add_argument("--no-variant", action="store_true", help=f"leave out {VARIANT} (dicts)")
    summaries.add_save_argument(parser, "inmemory")
    parser.add_argument("--one", nargs=2, metavar=("DATASET", "LOADER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2")
    if args.one:  # run from the module by its name, so that workers can import what it pickles
        from benchmarks.probes import inmemory

        print(json.dumps(inmemory._one(args.one[0], args.one[1], args.batches, args.epochs)))
        return
    chosen = cells(args.only, not args.no_variant)
    runs: dict[tuple[str, str], list[dict]] = {cell: [] for cell in chosen}
    load_before = os.getloadavg()
    for rep in range(args.reps):
        for kind, loader in chosen:
            r = run_timed_then_sampled(kind, loader, args.batches, args.epochs)
            runs[kind, loader].append(r)
            print(
                f"round {rep + 1}, {kind}, {loader}: first batch {r['ttfb1_s']:.3f} / "
                f"{r['ttfb2_s']:.3f} s (iter() {r['iter1_s']:.3f} / {r['iter2_s']:.3f}), "
                f"peak PSS {r['peak_pss_gb']:.2f} GB (main "
                f"{r['peak_main_pss_gb']:.2f}, children {r['peak_children_pss_gb']:.2f}), "
                f"end {r['end_pss_gb']:.2f} GB, processes {r['processes1']}/{r['processes']}"
                + (f", later epochs {r['ttfb_later_s']:.3f} s" if args.epochs > 2 else ""),
                file=sys.stderr,
                flush=True,
            )
    text = table(runs, args.reps, args.batches, args.epochs)
    rounds = paired(runs, args.epochs)
    print(text + paired_text(rounds))
    load_after = os.getloadavg()
    print("\nload average before:", *(f"{x:.2f}" for x in load_before))
    print("load average after: ", *(f"{x:.2f}" for x in load_after))
    if args.save:
        med = medians(runs)
        summary = {
            "paired": rounds,
            "config": {
                "batch": BATCH,
                "batches_per_epoch": args.batches,
                "epochs": args.epochs,
                "num_workers": WORKERS,
                "array_bytes": ROWS * ROW,
                "dicts": DICTS,
                "reps": args.reps,
                "cpus": os.cpu_count(),
                "load1_before_after": [load_before[0], load_after[0]],
            },
            "medians": {
                f"{kind}/{loader}": {
                    **m,
                    **{
                        f"{key}_x_dl": _ratio(med, kind, loader, key)
                        for key in ("ttfb1_s", "ttfb2_s", "ttfb_later_s", "peak_pss_gb")
                    },
                    "processes": sorted({r["processes"] for r in runs[kind, loader]}),
                }
                for (kind, loader), m in med.items()
            },
            "table": text,
        }
        summaries.save(args.save, summary)


if __name__ == "__main__":
    main()
