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
[--only array|dicts] [--no-variant] [--save [SECTION]] [--toy]``; results in
docs/benchmarks.md. ``--toy``: one round of 4 batches on a 16 MiB array and 10,000 dicts,
each cell run once (sampled), to check that it still runs.
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

from benchmarks import side_by_side

BATCH = 256
WORKERS = 2
ROW = 4096  # bytes per array item
ROWS = 2**30 // ROW  # 1 GiB
DICTS = 1_000_000
TOY_ROWS, TOY_DICTS = 2**24 // ROW, 10_000  # --toy: 16 MiB
MODULE = "benchmarks.probes.inmemory"
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
    """One uint8 array of ``rows`` rows (1 GiB); item i is row i (4 KiB), whose first 8 bytes
    hold i."""

    def __init__(self, rows: int = ROWS) -> None:
        self.data = np.empty((rows, ROW), dtype=np.uint8)
        self.data[:] = np.arange(ROW, dtype=np.uint64).astype(np.uint8)  # every page
        self.data[:, :8] = np.arange(rows, dtype="<u8")[:, None].view(np.uint8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.data[i]


class DictsDataset(Dataset):
    """A list of ``n`` (1M) small dicts; item i is (id, label)."""

    def __init__(self, n: int = DICTS) -> None:
        self.rows = [{"id": i, "label": i % 10, "text": f"sample {i}"} for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

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


def _one(kind: str, loader_name: str, batches: int, epochs: int = 2, toy: bool = False) -> dict:
    """One run in this fresh process: build, ``epochs`` epochs, their timings and memory."""
    from asyncloader import AsyncLoader

    gc.collect()
    t = clock()
    if kind == "array":
        dataset: Dataset = ArrayDataset(TOY_ROWS if toy else ROWS)
    else:
        dataset = DictsDataset(TOY_DICTS if toy else DICTS)
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


def run_timed_then_sampled(cell: str, batches: int, epochs: int, toy: bool) -> dict:
    """Two fresh-process runs of ``cell`` ("dataset/loader"): the times from one left alone,
        the peak memory from one whose PSS is sampled from here (reading a process's smaps takes
        its memory map's lock, which its ``fork()`` and page faults then wait for). ``toy``: the
    sampled run alone."""
    args = ("--one", *cell.split("/"), "--batches", batches, "--epochs", epochs)
    args += ("--toy",) if toy else ()
    sampled = side_by_side.in_fresh_process_sampled(
        MODULE, *args, every_s=SAMPLE_EVERY_S, timeout_s=RUN_TIMEOUT_S
    )
    timed = (
        sampled if toy else side_by_side.in_fresh_process(MODULE, *args, timeout_s=RUN_TIMEOUT_S)
    )
    memory = {key: sampled[key] for key in sampled if "pss" in key or key.startswith("process")}
    return {
        **timed,
        **memory,
        "sampled_ttfb1_s": sampled["ttfb1_s"],
        "sampled_ttfb2_s": sampled["ttfb2_s"],
    }


def cells(only: list[str] | None, variant: bool) -> list[str]:
    """ "dataset/loader" in the order of a round."""
    out = []
    for kind in only or DATASETS:
        out += [f"{kind}/{loader}" for loader in LOADERS]
        if variant and kind == "dicts":
            out.append(f"{kind}/{VARIANT}")
    return out


def paired(runs: dict[str, list[dict]], epochs: int) -> dict[str, dict[str, tuple]]:
    """Per round, each loader's first-batch times over DataLoader's of the same round (run
    just before or after it): ``{"dataset/loader": {key: (lowest, median, highest)}}``."""
    keys = ["ttfb1_s", "ttfb2_s"] + (["ttfb_later_s"] if epochs > 2 else [])
    out: dict[str, dict[str, tuple]] = {}
    for kind in DATASETS:
        group = {cell: rs for cell, rs in runs.items() if cell.startswith(kind + "/")}
        for key in keys:
            for cell, spread in side_by_side.paired(group, f"{kind}/{REFERENCE}", key).items():
                out.setdefault(cell, {})[key] = spread
    return out


def x_dl(med: dict[str, dict[str, float]], cell: str, key: str) -> float | None:
    """``cell``'s median of ``key`` over DataLoader's on the same dataset."""
    ref = med.get(cell.split("/")[0] + "/" + REFERENCE)
    return med[cell][key] / ref[key] if ref and key in med[cell] else None


def table(runs: dict[str, list[dict]], reps: int, batches: int, epochs: int) -> str:
    med = side_by_side.medians(runs, KEYS)
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

    def cell(name: str, key: str, digits: int) -> str:
        r = x_dl(med, name, key)
        return f"| {med[name][key]:.{digits}f} | {'-' if r is None else f'{r:.2f}'} "

    for name, m in med.items():
        procs = sorted({r["processes"] for r in runs[name]})
        lines.append(
            f"| {name.replace('/', ' | ', 1)} "
            + cell(name, "ttfb1_s", 3)
            + cell(name, "ttfb2_s", 3)
            + (cell(name, "ttfb_later_s", 3) if later else "")
            + cell(name, "peak_pss_gb", 2)
            + f"| {m['end_pss_gb']:.2f} | {'/'.join(map(str, procs))} |"
        )
    lines += ["", "Per round (x DL of the same round; median, lowest-highest):"]
    for name, by_key in paired(runs, epochs).items():
        cells = ", ".join(
            f"{key[:-2]} {m:.2f} ({lo:.2f}-{hi:.2f})" for key, (lo, m, hi) in by_key.items()
        )
        lines.append(f"  {name}: {cells}")
    return "\n".join(lines)


def report(cell: str, r: dict, epochs: int) -> None:
    """One run's figures, on stderr as the runs go."""
    print(
        f"{cell}: first batch {r['ttfb1_s']:.3f} / {r['ttfb2_s']:.3f} s (iter() "
        f"{r['iter1_s']:.3f} / {r['iter2_s']:.3f}), peak PSS {r['peak_pss_gb']:.2f} GB (main "
        f"{r['peak_main_pss_gb']:.2f}, children {r['peak_children_pss_gb']:.2f}), end "
        f"{r['end_pss_gb']:.2f} GB, processes {r['processes1']}/{r['processes']}"
        + (f", later epochs {r['ttfb_later_s']:.3f} s" if epochs > 2 else ""),
        file=sys.stderr,
        flush=True,
    )


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
    side_by_side.add_save_argument(parser, "inmemory")
    parser.add_argument("--toy", action="store_true", help="one round, 4 batches, tiny datasets")
    parser.add_argument("--one", nargs=2, metavar=("DATASET", "LOADER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2")
    if args.one:  # run from the module by its name, so that workers can import what it pickles
        from benchmarks.probes import inmemory

        one = inmemory._one(*args.one, args.batches, args.epochs, args.toy)
        print(json.dumps(one))
        return
    if args.toy:
        args.reps, args.batches = 1, 4

    def one_run(cell: str) -> dict:
        result = run_timed_then_sampled(cell, args.batches, args.epochs, args.toy)
        report(cell, result, args.epochs)
        return result

    load_before = os.getloadavg()
    runs = side_by_side.rounds(cells(args.only, not args.no_variant), args.reps, one_run)
    text = table(runs, args.reps, args.batches, args.epochs)
    print(text)
    load_after = os.getloadavg()
    print("\nload average before:", *(f"{x:.2f}" for x in load_before))
    print("load average after: ", *(f"{x:.2f}" for x in load_after))
    if args.save:
        med = side_by_side.medians(runs, KEYS)
        keys = ("ttfb1_s", "ttfb2_s", "ttfb_later_s", "peak_pss_gb")
        summary = {
            "paired": paired(runs, args.epochs),
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
                cell: {
                    **m,
                    **{f"{key}_x_dl": x_dl(med, cell, key) for key in keys},
                    "processes": sorted({r["processes"] for r in runs[cell]}),
                }
                for cell, m in med.items()
            },
            "table": text,
        }
        side_by_side.save(args.save, summary)


if __name__ == "__main__":
    main()
