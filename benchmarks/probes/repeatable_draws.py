"""Do random augmentations repeat with the same seed?

An epoch of 64 samples, ``shuffle=True`` with a seeded ``generator``, batches of 4, a
``__getitem__`` and a ``transform`` that draw from torch's, Python's and numpy's global RNGs.
Each run is a fresh process. Reported, for asyncloader (``num_workers`` 1, 2 and 3) and for
DataLoader (2 workers):

- **runs identical**: of ``--runs`` runs with 2 workers, how many equal the first (itself
  included), draw for draw;
- **workers 1 = 2 = 3**: one epoch each with 1, 2 and 3 workers, all equal;
- **resume = uninterrupted**: a run stopped after 5 batches and resumed (``state_dict``
  through JSON, 1 worker) gives the uninterrupted run's remaining batches.

``python -m benchmarks.probes.repeatable_draws [--runs 5]``. Measured on the 2-core
machine: asyncloader 5 of 5, True, True; before per-batch seeds (commit bffa303) 1 of 5,
False, False; DataLoader 5 of 5 for its one worker count.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SEED = 7


class Augmented(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> list[float]:
        return [index, torch.rand(()).item(), random.random(), float(np.random.rand())]


def jitter(sample: list[float]) -> list[float]:
    return [*sample, torch.rand(()).item()]


def collate(samples: list[list[float]]) -> list[list[float]]:
    return samples


def _loader(kind: str, num_workers: int):
    generator = torch.Generator().manual_seed(SEED)
    if kind == "dataloader":
        # DataLoader has no transform: the same draws in a collate_fn over each sample.
        return DataLoader(Augmented(), 4, shuffle=True, num_workers=num_workers,
                          generator=generator,
                          collate_fn=lambda s: [jitter(x) for x in s])  # fmt: skip
    from asyncloader import AsyncLoader

    return AsyncLoader(Augmented(), batch_size=4, shuffle=True, num_workers=num_workers,
                       generator=generator, transform=jitter, collate_fn=collate)  # fmt: skip


def _epoch(kind: str, num_workers: int, stop: int | None = None) -> dict:
    loader = _loader(kind, num_workers)
    if stop is None:
        return {"batches": list(loader)}
    it = iter(loader)
    seen = [next(it) for _ in range(stop)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = _loader(kind, 1)
    resumed.load_state_dict(state)
    return {"batches": seen + list(resumed)}


def _fresh(kind: str, num_workers: int, stop: int | None = None) -> list:
    args = [sys.executable, "-m", "benchmarks.probes.repeatable_draws", "--one", kind,
            str(num_workers), str(stop)]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out.splitlines()[-1])["batches"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, workers, stop = args.one
        print(json.dumps(_epoch(kind, int(workers), None if stop == "None" else int(stop))))
        return
    rows = []
    for kind in ("asyncloader", "dataloader"):
        runs = [_fresh(kind, 2) for _ in range(args.runs)]
        same = sum(run == runs[0] for run in runs)
        counts = "n/a (batch i -> worker i % n)"
        if kind == "asyncloader":
            counts = str(_fresh(kind, 1) == runs[0] == _fresh(kind, 3))
        resume = (
            str(_fresh(kind, 2, stop=5) == runs[0]) if kind == "asyncloader" else "n/a"
        )  # DataLoader has no state_dict
        rows.append((kind, f"{same} of {args.runs}", counts, resume))
    print("| loader | runs identical (2 workers) | workers 1 = 2 = 3 | resume = uninterrupted |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
