"""Lightning ``Trainer.fit`` runs on AsyncLoaders (or DataLoaders), one after the other, in one
interpreter (tests/system/trainers/test_lightning.py).

``python -m tests.system.trainers.scripts.lightning_job PLAN OUT``: ``PLAN`` is a JSON list of runs,
each a dict of the options below; ``OUT`` gets one result per run: ``train``, each step's
``[epoch, batch_idx, global_step, sample indices]``; ``val``, each validation batch's sample
indices; ``kept``, whether the trainer's train and val loaders are the objects passed to
``fit``.

Run options: ``loader`` ("async" or "torch"), ``stream`` (the training samples as an iterable
dataset without ``__len__``, in order), ``shuffle``, ``epochs``, ``max_steps`` (iteration-based
training, instead of ``epochs``), ``ckpt_dir`` and ``ckpt_every`` (a
``ModelCheckpoint(every_n_train_steps=k)`` per ``k``, saving to
``ckpt_dir/every<k>/step=<n>.ckpt``), ``ckpt_epochs`` (ModelCheckpoint's default schedule too,
at each epoch's end, to ``ckpt_dir/epochs/``), ``kill_at`` (SIGKILL this process at that global
step, as a preemption), ``resume`` (``ckpt_path``), ``epoch_end_fix`` (the example's
``ResumeAtEpochEnd`` callback), ``schedule`` ("len": OneCycleLR sized from the loader's length;
"estimated": from ``trainer.estimated_stepping_batches``), ``devices`` (more than 1: DDP on
CPU, Lightning starting the other ranks; each rank writes ``OUT.<rank>``, and the train loader
is built with ``distributed=True``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from asyncloader import AsyncLoader
from examples.lightning_train import ResumeAtEpochEnd

TRAIN_SAMPLES, VAL_SAMPLES, BATCH = 96, 40, 8  # 12 steps an epoch; 2 validation batches


class Samples(torch.utils.data.Dataset):
    """Sample ``i``: ``(i, x, y)``, the same on every call."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return i, torch.randn(4, generator=g), torch.randn(1, generator=g)


class Stream(torch.utils.data.IterableDataset):
    """The samples of ``Samples(n)`` in order, as a stream without a length."""

    def __init__(self, n: int) -> None:
        self.samples = Samples(n)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        return (self.samples[i] for i in range(len(self.samples)))


class Recorder(L.LightningModule):
    """A linear model; records the samples of every training and validation step."""

    def __init__(self, steps_per_epoch: int, schedule: str) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.steps_per_epoch, self.schedule = steps_per_epoch, schedule
        self.train_seen: list[list[Any]] = []
        self.val_seen: list[list[int]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids = batch["idx"].tolist()
        self.train_seen.append([self.current_epoch, batch_idx, self.global_step, ids])
        return nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val_seen.append(batch["idx"].tolist())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        if self.schedule == "estimated":
            steps = {"total_steps": self.trainer.estimated_stepping_batches}
        elif self.trainer.max_steps > 0:
            steps = {"total_steps": self.trainer.max_steps}
        else:
            steps = {"epochs": self.trainer.max_epochs, "steps_per_epoch": self.steps_per_epoch}
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, **steps)
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]


class KillAt(Callback):
    """SIGKILLs this process once ``step`` optimiser steps are done: a lost machine."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class Kept(Callback):
    """Whether Lightning trains on the loader objects given to ``fit`` (not copies)."""

    def __init__(self, train: object, val: object) -> None:
        self.train, self.val = train, val
        self.kept: list[bool] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.kept = [trainer.train_dataloader is self.train, trainer.val_dataloaders is self.val]


def loaders(kind: str, shuffle: bool, distributed: bool, stream: bool) -> tuple[Any, Any]:
    """Train and val loaders with lambda collate functions and two workers, as users write."""
    make = AsyncLoader if kind == "async" else torch.utils.data.DataLoader
    options: dict[str, Any] = {"distributed": True} if distributed else {}
    if not stream:
        options["shuffle"] = shuffle
    train = make(
        Stream(TRAIN_SAMPLES) if stream else Samples(TRAIN_SAMPLES),
        batch_size=BATCH,
        generator=torch.Generator().manual_seed(0),
        num_workers=2,
        collate_fn=lambda samples: {
            "idx": torch.tensor([s[0] for s in samples]),
            "x": torch.stack([s[1] for s in samples]),
            "y": torch.stack([s[2] for s in samples]),
        },
        **options,
    )
    val = make(
        Samples(VAL_SAMPLES),
        batch_size=32,
        num_workers=2,
        collate_fn=lambda samples: {
            "idx": torch.tensor([s[0] for s in samples]),
            "x": torch.stack([s[1] for s in samples]),
            "y": torch.stack([s[2] for s in samples]),
        },
    )
    return train, val


def fit(run: dict[str, Any], root: Path) -> dict[str, Any]:
    """One ``Trainer.fit``; files it writes go under ``root`` (or ``ckpt_dir``)."""
    devices = run.get("devices", 1)
    stream = run.get("stream", False)
    train, val = loaders(run.get("loader", "async"), run.get("shuffle", True), devices > 1, stream)
    steps_per_epoch = TRAIN_SAMPLES // BATCH if stream else len(train)
    model = Recorder(steps_per_epoch, run.get("schedule", "len"))
    kept = Kept(train, val)
    callbacks: list[Callback] = [kept]
    for every in run.get("ckpt_every", []):
        dirpath = Path(run["ckpt_dir"]) / f"every{every}"
        callbacks.append(
            ModelCheckpoint(dirpath, "{step}", every_n_train_steps=every, save_top_k=-1)
        )
    if run.get("ckpt_epochs"):
        dirpath = Path(run["ckpt_dir"]) / "epochs"
        callbacks.append(ModelCheckpoint(dirpath, "{step}", save_top_k=-1))
    if run.get("kill_at") is not None:
        callbacks.append(KillAt(run["kill_at"]))
    if run.get("epoch_end_fix"):
        callbacks.append(ResumeAtEpochEnd(train))
    trainer = L.Trainer(
        max_epochs=None if "max_steps" in run else run.get("epochs", 2),
        max_steps=run.get("max_steps", -1),
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        enable_checkpointing=bool(run.get("ckpt_every") or run.get("ckpt_epochs")),
        default_root_dir=run.get("ckpt_dir", root),
    )
    trainer.fit(model, train, val, ckpt_path=run.get("resume"))
    for loader in (train, val):
        if isinstance(loader, AsyncLoader):
            loader.close()
    return {
        "train": model.train_seen,
        "val": model.val_seen,
        "kept": kept.kept,
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
    }


def main() -> None:
    plan, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    results = [fit(run, out.parent) for run in plan]
    if results and results[-1]["world_size"] > 1:
        out = Path(f"{out}.{results[-1]['rank']}")
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
