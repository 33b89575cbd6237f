"""A Hugging Face ``datasets.Dataset`` in torch format, through DataLoader and AsyncLoader
(``__getitems__``).

The dataset: ``--rows`` rows (100,000 by default) of an ``int64`` label (the row's number) and
a ``float32`` feature vector of ``--dim`` values (16; the first is the row's number again),
``.with_format("torch")``, in memory. Both loaders read it with ``batch_size=256``,
``shuffle=True`` and the default collate, as a user would write it; DataLoader calls the
dataset's ``__getitems__`` once per batch; AsyncLoader reads the batch's columns with one
``dataset[indices]`` (the dict that ``__getitems__`` splits into rows).

Cases: each loader with ``num_workers`` 0 and 2, and AsyncLoader with ``fetch_in_workers=True``
and 2 workers; and DataLoader "by columns", the fastest a DataLoader user can read this
dataset: a ``BatchSampler`` passed as ``sampler`` with ``batch_size=None``, so that each batch
is one ``dataset[indices]`` and nothing is collated. Each run is a fresh process (the dataset
built and the heap collected before the clock starts, as :func:`benchmarks.run_one.measure`
times it: from building the loader to its last batch, worker start included), the cases
alternating, ``--reps`` times; every batch is checked (each row exactly once, features
matching labels). ``--step-ms S`` adds a training step after each batch that waits S ms
without holding the GIL (``time.sleep``, as a step waiting on the GPU does); by default the
consumer only checks the batch. Reported: the median rows/s over the epoch, after the first
batch (steady), CPU ms per 1000 rows of the whole process tree, and the per-round ratios to
DataLoader with the same ``num_workers``, plain and by columns.

``python -m benchmarks.probes.hf_datasets [--reps 3] [--rows 100000] [--dim 16]
[--step-ms 0] [--only CASE...] [--save [SECTION]] [--toy]``; ``--toy``: one round of 2,048
rows, to check that it still runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks import side_by_side

MODULE = "benchmarks.probes.hf_datasets"
BATCH = 256
#: case -> (loader, num_workers, extra AsyncLoader options)
CASES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "DataLoader, 0 workers": ("DataLoader", 0, {}),
    "AsyncLoader, 0 workers": ("AsyncLoader", 0, {}),
    "DataLoader, 2 workers": ("DataLoader", 2, {}),
    # The batch sampler as DataLoader's sampler: one dataset[indices] per batch, no collate.
    "DataLoader by columns, 0 workers": ("DataLoader", 0, {"by_columns": True}),
    "DataLoader by columns, 2 workers": ("DataLoader", 2, {"by_columns": True}),
    "AsyncLoader, 2 workers": ("AsyncLoader", 2, {}),
    "AsyncLoader, 2 fetching": ("AsyncLoader", 2, {"fetch_in_workers": True}),
}
KEYS = ("items_per_s", "steady_items_per_s", "ttfb_s", "cpu_ms_per_item")


def make_dataset(rows: int, dim: int) -> Any:
    """The ``datasets.Dataset`` of the module docstring, in torch format."""
    import datasets
    import numpy as np

    features = np.random.default_rng(0).random((rows, dim), dtype=np.float32)
    features[:, 0] = np.arange(rows, dtype=np.float32)  # exact below 2**24
    table = {"label": np.arange(rows, dtype=np.int64), "x": features}
    return datasets.Dataset.from_dict(table).with_format("torch")


class RowChecker:
    """What :func:`benchmarks.run_one.measure` checks batches with: every row exactly once,
    as a dict of a label tensor and a feature matrix whose first column is the label."""

    def __init__(self, rows: int, dim: int, step_s: float = 0.0) -> None:
        import numpy as np

        self.n, self.dim, self.step_s = rows, dim, step_s
        self._seen = np.zeros(rows, dtype=np.int64)

    def add(self, batch: Any) -> int:
        import numpy as np
        import torch

        from benchmarks.checks import DeliveryError

        labels, x = batch["label"], batch["x"]
        if labels.dtype != torch.int64 or x.dtype != torch.float32 or x.shape[1:] != (self.dim,):
            raise DeliveryError(f"batch of {labels.dtype} labels and {x.dtype} {tuple(x.shape)}")
        if not torch.equal(x[:, 0], labels.to(torch.float32)):
            raise DeliveryError("features do not belong to their labels")
        np.add.at(self._seen, labels.numpy(), 1)
        if self.step_s:
            time.sleep(self.step_s)  # the training step, waiting without the GIL
        return len(labels)

    def verify(self) -> None:
        from benchmarks.checks import DeliveryError

        if not (self._seen == 1).all():
            missing, repeated = int((self._seen == 0).sum()), int((self._seen > 1).sum())
            raise DeliveryError(f"{missing} rows never delivered, {repeated} more than once")


def one(case: str, rows: int, dim: int, step_ms: float = 0.0) -> dict[str, Any]:
    """One epoch of ``case`` in this process, timed and checked."""
    import contextlib
    import gc

    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    from benchmarks.loaders import iterating
    from benchmarks.run_one import measure

    loader_name, workers, options = CASES[case]
    dataset = make_dataset(rows, dim)
    checker = RowChecker(rows, dim, step_ms / 1e3)
    generator = torch.Generator().manual_seed(0)
    kwargs = {"batch_size": BATCH, "shuffle": True, "num_workers": workers, "generator": generator}

    @contextlib.contextmanager
    def build() -> Any:  # built inside measure(), after its clock starts
        if options.get("by_columns"):
            batches = BatchSampler(RandomSampler(dataset, generator=generator), BATCH, False)
            sampled = {"sampler": batches, "batch_size": None, "num_workers": workers}
            with iterating(DataLoader(dataset, **sampled)) as it:
                yield it
            return
        if loader_name == "DataLoader":
            with iterating(DataLoader(dataset, **kwargs)) as it:
                yield it
            return
        from asyncloader import AsyncLoader

        loader = AsyncLoader(dataset, **kwargs, **options)
        with loader, contextlib.closing(iter(loader)) as it:
            yield it

    if loader_name == "AsyncLoader":
        import asyncloader  # noqa: F401  (imported before the clock, as run_one does)
    gc.collect()
    return measure(build(), checker)


#: The anchors each case is compared with, as names for its ``num_workers``.
ANCHORS = ("DataLoader, {} workers", "DataLoader by columns, {} workers")


def paired_ratios(runs: dict[str, list[dict]], anchor: str) -> dict[str, tuple]:
    """Each case's per-round rows/s over the ``anchor`` case's with the same ``num_workers``
    (:func:`benchmarks.side_by_side.paired` within each worker count)."""
    out: dict[str, tuple] = {}
    for workers in {CASES[name][1] for name in runs}:
        group = {name: rs for name, rs in runs.items() if CASES[name][1] == workers}
        out |= side_by_side.paired(group, anchor.format(workers))
    return out


def _per_round(spread: tuple[float, float, float] | None) -> str:
    return f"{spread[1]:.2f}x ({spread[0]:.2f}-{spread[2]:.2f})" if spread else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="run these cases only")
    side_by_side.add_save_argument(parser, "hf_datasets")
    parser.add_argument("--toy", action="store_true", help="one round of 2,048 rows")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.toy:
        args.reps, args.rows = 1, 2048
    if args.one:
        print(json.dumps(one(args.one, args.rows, args.dim, args.step_ms)))
        return
    sizes = ("--rows", args.rows, "--dim", args.dim, "--step-ms", args.step_ms)
    runs = side_by_side.rounds(
        args.only or list(CASES),
        args.reps,
        lambda name: side_by_side.in_fresh_process(MODULE, "--one", name, *sizes),
        snake=True,
    )
    medians = side_by_side.medians(runs, KEYS)
    print(
        f"datasets.Dataset, {args.rows} rows (int64 label, float32 x{args.dim}), torch format, "
        f"batch {BATCH}, shuffle, a {args.step_ms:g} ms step per batch; {args.reps} fresh "
        "processes each, alternating (medians):"
    )
    print(
        f"  {'case':32s} {'rows/s':>9s} {'steady':>9s} {'first s':>8s} {'CPU ms/1k rows':>14s} "
        f"{'vs DataLoader':>13s} {'per round (range)':>20s} {'vs by columns, per round':>25s}"
    )
    paired = {anchor: paired_ratios(runs, anchor) for anchor in ANCHORS}
    for name, m in medians.items():
        base = medians.get(ANCHORS[0].format(CASES[name][1]))
        ratio = f"{m['items_per_s'] / base['items_per_s']:.2f}x" if base else "-"
        rounds = [_per_round(paired[anchor].get(name)) for anchor in ANCHORS]
        print(
            f"  {name:32s} {m['items_per_s']:9.0f} {m['steady_items_per_s']:9.0f} "
            f"{m['ttfb_s']:8.3f} {m['cpu_ms_per_item'] * 1e3:14.1f} {ratio:>13s} "
            f"{rounds[0]:>20s} {rounds[1]:>25s}"
        )
    if args.save:
        side_by_side.save(
            args.save,
            {"rows": args.rows, "dim": args.dim, "batch": BATCH, "step_ms": args.step_ms,
             "reps": args.reps, "medians": medians, "paired": paired[ANCHORS[0]],
             "paired_by_columns": paired[ANCHORS[1]]},
        )  # fmt: skip


if __name__ == "__main__":
    main()
