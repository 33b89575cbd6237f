"""A Hugging Face ``datasets.IterableDataset`` (streaming) through AsyncLoader, resumed through its
own ``state_dict`` (tests/system/trainers/test_hf_datasets.py), offline.

``python -m tests.system.trainers.scripts.hf_datasets_job PLAN OUT``: ``PLAN`` is a JSON list of
loader options (``num_workers``, ``fetch_in_workers``); per entry ``OUT`` gets ``full``, the
batches' sample indices per epoch of an uninterrupted run; ``dataloader``, the same from a
torch DataLoader with the same ``num_workers``; ``resumed``, for each cut ``[epoch, batches]``
(a state taken after that many batches of that epoch), what a new loader on a new dataset
gives from the cut to the end; ``layout``, where the dataset's own state sits in the state.

The loop calls ``dataset.set_epoch(epoch)`` before each epoch, as with a DataLoader: datasets
keeps the epoch in shared memory for the workers, and applies a loaded state while its epoch
is the state's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import datasets
import torch

from asyncloader import AsyncLoader

SAMPLES, SHARDS, BATCH, EPOCHS = 64, 4, 8, 2
CUTS = [[0, 1], [0, 3], [0, 6], [1, 0], [1, 5]]  # [1, 0]: saved after epoch 0 ended


def stream() -> datasets.IterableDataset:
    table = {"idx": list(range(SAMPLES)), "x": [[float(i)] * 4 for i in range(SAMPLES)]}
    return datasets.Dataset.from_dict(table).to_iterable_dataset(num_shards=SHARDS)


def epoch_ids(loader: Any, dataset: datasets.IterableDataset, epoch: int) -> list[list[int]]:
    dataset.set_epoch(epoch)
    return [batch["idx"].tolist() for batch in loader]


def cut(options: dict[str, Any], epoch: int, taken: int) -> dict[str, Any]:
    """The loader's state after ``taken`` batches of ``epoch`` (after ``epoch - 1`` ended
    when ``taken`` is 0)."""
    dataset = stream()
    loader = AsyncLoader(dataset, batch_size=BATCH, **options)
    for e in range(epoch):
        epoch_ids(loader, dataset, e)
    if taken:
        dataset.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(taken):
            next(batches)
    state = loader.state_dict()
    loader.close()
    return state


def resumed(options: dict[str, Any], state: dict[str, Any]) -> list[list[list[int]]]:
    """What a new loader on a new dataset gives from ``state`` to the end of the last epoch."""
    dataset = stream()
    loader = AsyncLoader(dataset, batch_size=BATCH, **options)
    loader.load_state_dict(json.loads(json.dumps(state)))  # as from a JSON checkpoint
    out = [epoch_ids(loader, dataset, epoch) for epoch in range(state["epoch"], EPOCHS)]
    loader.close()
    return out


def layout(options: dict[str, Any], state: dict[str, Any]) -> str:
    """Where datasets' own state is: StatefulDataLoader's places."""
    if options.get("fetch_in_workers"):
        workers = state["_snapshot"]["_worker_snapshots"]
        if all("examples_iterable" in w["dataset_state"] for w in workers.values()):
            return "per worker"
    elif "examples_iterable" in (state.get("dataset_state") or {}):
        return "dataset_state"
    return "missing"


def check(options: dict[str, Any]) -> dict[str, Any]:
    dataset = stream()
    loader = AsyncLoader(dataset, batch_size=BATCH, **options)
    full = [epoch_ids(loader, dataset, epoch) for epoch in range(EPOCHS)]
    loader.close()
    dataset = stream()
    torch_loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, num_workers=options.get("num_workers", 0)
    )
    dataloader = [epoch_ids(torch_loader, dataset, epoch) for epoch in range(EPOCHS)]
    states = {f"{epoch}:{taken}": cut(options, epoch, taken) for epoch, taken in CUTS}
    return {
        "full": full,
        "dataloader": dataloader,
        "resumed": {key: resumed(options, state) for key, state in states.items()},
        "layout": layout(options, states["0:3"]),
    }


def main() -> None:
    plan, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps([check(options) for options in plan]))


if __name__ == "__main__":
    main()
