"""An ``accelerate`` training loop on an AsyncLoader (tests/system/trainers/test_accelerate.py):
``distributed=True``, ``device=accelerator.device``, the loader registered for checkpointing.

``python -m tests.system.trainers.scripts.accelerate_job PLAN OUT``, alone or under torchrun (each
rank writes ``OUT.<rank>``). ``PLAN`` is a JSON list of runs, one after the other in this
process, each a dict: ``epochs``, ``ckpt_dir``, ``save_at`` (global steps after which
``accelerator.save_state(ckpt_dir/step<n>)`` runs), ``resume`` (a folder for
``accelerator.load_state``). Each run's result: ``steps``, ``[epoch, global_step, sample
indices]`` per step; ``dataloader``, the batches a DataLoader over a ``DistributedSampler``
with the same seed gives this rank, per epoch; ``prepared_is_loader``, whether
``accelerator.prepare`` returned the loader itself; ``skip_type``, the class
``accelerator.skip_first_batches`` returns for it; ``device``, where the batches were.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from asyncloader import AsyncLoader

SAMPLES, BATCH, SEED = 96, 8, 0


class Samples(torch.utils.data.Dataset):
    """Sample ``i``: ``(i, x, y)``, the same on every call."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return i, torch.randn(4, generator=g), torch.randn(1, generator=g)


class Progress:
    """The loop's global step, checkpointed with the loader (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def collate(samples: list) -> dict[str, torch.Tensor]:
    return {
        "idx": torch.tensor([s[0] for s in samples]),
        "x": torch.stack([s[1] for s in samples]),
        "y": torch.stack([s[2] for s in samples]),
    }


def train(run: dict[str, Any]) -> dict[str, Any]:
    accelerator = Accelerator(cpu=True)  # under torchrun: joins the process group (gloo)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = AsyncLoader(
        Samples(),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
        distributed=True,
        device=accelerator.device,
        num_workers=2,
        collate_fn=collate,
    )
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(loader, progress)
    if run.get("resume"):
        accelerator.load_state(run["resume"])
    steps, devices = [], set()
    for epoch in range(loader.state_dict()["epoch"], run.get("epochs", 2)):
        for batch in loader:  # a resumed epoch goes on from the checkpoint's batch
            devices.add(str(batch["x"].device))
            loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            steps.append([epoch, progress.step, batch["idx"].tolist()])
            if progress.step in run.get("save_at", []):
                accelerator.save_state(str(Path(run["ckpt_dir"]) / f"step{progress.step}"))
    skip_type = type(accelerator.skip_first_batches(loader, 2)).__qualname__
    loader.close()
    accelerator.wait_for_everyone()
    return {
        "steps": steps,
        "dataloader": reference_batches(accelerator, run.get("epochs", 2)),
        "prepared_is_loader": prepared is loader,
        "skip_type": skip_type,
        "device": sorted(devices),
        "world_size": accelerator.num_processes,
    }


def reference_batches(accelerator: Accelerator, epochs: int) -> list[list[list[int]]]:
    """This rank's batches per epoch from a DataLoader over a DistributedSampler (seed SEED)."""
    sampler = DistributedSampler(
        Samples(),
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        shuffle=True,
        seed=SEED,
    )
    loader = DataLoader(Samples(), batch_size=BATCH, sampler=sampler, collate_fn=collate)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append([batch["idx"].tolist() for batch in loader])
    return out


def main() -> None:
    plan, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    results = [train(run) for run in plan]
    if "LOCAL_RANK" in os.environ:  # under torchrun
        out = Path(f"{out}.{os.environ['RANK']}")
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
