"""What ``asyncloader.sources.Mix`` costs on the ``overhead`` workload, and the proportions
of its draws.

Throughput (``python -m benchmarks.probes.mix [--reps 5] [--items N]``): the ``overhead``
workload (40000 bare indices, batch 64, 2 workers: what is left is the loader's own cost),
each variant's epoch timed and checked as the benchmark does (:func:`benchmarks.run_one.
measure`: every index once), in fresh processes, alternating, ``--reps`` times; prints the
median items/s and CPU ms per item of each, and the median of its per-rep ratios to
``alone`` (with the ratios themselves):

- ``alone``: the workload's map-style source by itself (the loader's sampler, the reads in
  the workers);
- ``mix``: ``Mix`` of three map-style sources splitting the indices (weights 1:1:1,
  ``"all_exhausted"``): read as a map-style dataset, its sampler's draws and the Mix's state
  per batch in the training process, the reads in the workers;
- ``mix-fiw``: the same with ``fetch_in_workers=True``;
- ``mix1``: ``Mix`` of the workload's source alone;
- ``iterable``: a plain iterable over the same indices (the loader's iterable path alone,
  without Mix);
- ``stateful``: the same with ``state_dict()`` (which the loader then saves before each
  batch, as it does a Mix's with an iterable source).

Proportions (``--proportions``): 100,000 draws of ``stop="never"`` from three sources of
weights 0.5, 0.3 and 0.2; prints each source's share and its distance to its weight.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from collections.abc import Iterator
from typing import Any

from benchmarks.loaders import CPU_WORKERS
from benchmarks.side_by_side import in_fresh_process
from benchmarks.workloads import WORKLOADS, IndexSource

VARIANTS = ("alone", "mix", "mix-fiw", "mix1", "iterable", "stateful")
#: The loader's options of each variant beside the workload's.
OPTIONS = {"mix-fiw": {"fetch_in_workers": True}}
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}


class Offset:
    """Indices ``[start, start + n)``: one part of the workload's indices."""

    def __init__(self, n: int, start: int) -> None:
        self.n, self.start = n, start

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return self.start + index


class Indices:
    """The workload's indices as a plain iterable."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class StatefulIndices(Indices):
    """:class:`Indices` with a state (its position), as the loader saves a Mix's per batch."""

    def __iter__(self) -> Iterator[int]:
        self.at = 0
        for i in range(self.n):
            self.at = i + 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"at": getattr(self, "at", 0)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


def dataset(variant: str, n: int) -> Any:
    from asyncloader.sources import Mix

    if variant == "alone":
        return IndexSource(n)
    if variant == "iterable":
        return Indices(n)
    if variant == "stateful":
        return StatefulIndices(n)
    if variant == "mix1":
        return Mix({"overhead": IndexSource(n)}, {"overhead": 1})
    cuts = [0, n // 3, 2 * n // 3, n]
    parts = {f"part{k}": Offset(cuts[k + 1] - cuts[k], cuts[k]) for k in range(3)}
    return Mix(parts, dict.fromkeys(parts, 1))


def one_run(variant: str, items: int) -> dict[str, float]:
    """Items/s and CPU ms per item (this process and its workers) of one checked epoch of
    ``variant`` (the benchmark's clock, CPU count and check)."""
    import gc

    from benchmarks.checks import Checker
    from benchmarks.loaders import asyncloader_loader
    from benchmarks.run_one import measure

    workload = WORKLOADS["overhead"]
    data = dataset(variant, items)
    gc.collect()
    loader = asyncloader_loader(workload, data, CPU_WORKERS, **OPTIONS.get(variant, {}))
    timings = measure(loader, Checker(items, workload.shape))
    return {"items_per_s": timings["items_per_s"], "cpu_ms": timings["cpu_ms_per_item"]}


def proportions(draws: int) -> dict[str, float]:
    """Each source's share of ``draws`` draws of ``stop="never"`` with :data:`WEIGHTS`."""
    from asyncloader.sources import Mix

    sources = {name: [name] * 1000 for name in WEIGHTS}  # lists: map-style, restarted forever
    mix = Mix(sources, WEIGHTS, stop="never", samples_per_epoch=draws)
    counts = Counter(mix)
    return {name: counts[name] / draws for name in WEIGHTS}


def side_by_side(variants: list[str], reps: int, items: int) -> None:
    """Runs ``variants`` in fresh processes, alternating, ``reps`` times; prints each one's
    medians and its paired ratio to ``alone`` (each rep's runs ran back to back)."""
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(reps):
        for variant in runs:
            child = ("benchmarks.probes.mix", "--items", items, "--child", variant)
            runs[variant].append(in_fresh_process(*child))
    for variant, got in runs.items():
        print(summary(variant, got, runs.get("alone")))


def summary(variant: str, got: list[dict[str, float]], alone: list[dict[str, float]] | None) -> str:
    """One variant's median items/s and CPU ms per item, and its paired ratio to ``alone``."""
    rates = [r["items_per_s"] for r in got]
    cpu = statistics.median(r["cpu_ms"] for r in got)
    line = f"{variant:9}: {statistics.median(rates):8.0f} items/s, {cpu:.4f} CPU ms/item"
    if alone is not None and variant != "alone":
        pairs = [r / a["items_per_s"] for r, a in zip(rates, alone, strict=True)]
        line += f"  x{statistics.median(pairs):.3f} of alone (median of pairs"
        line += f" {[round(p, 2) for p in pairs]})"
    return f"{line}  runs={[round(r) for r in rates]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--items", type=int, default=WORKLOADS["overhead"].items)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--proportions", action="store_true")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.proportions:
        for name, share in proportions(100_000).items():
            off = share - WEIGHTS[name]
            print(f"{name}: weight {WEIGHTS[name]:.3f} share {share:.4f} off {off:+.4f}")
    elif args.child:
        print(json.dumps(one_run(args.child, args.items)))
    else:
        side_by_side(args.variants, args.reps, args.items)


if __name__ == "__main__":
    main()
