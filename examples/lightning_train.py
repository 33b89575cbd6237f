"""Train with PyTorch Lightning on AsyncLoaders, checkpoint mid-epoch, and resume exactly.

::

    python examples/lightning_train.py --ckpt-dir /tmp/pl --stop-after 20   # "preempted"
    python examples/lightning_train.py --ckpt-dir /tmp/pl --resume /tmp/pl/step=15.ckpt

The train and validation loaders are ``AsyncLoader`` objects passed to ``Trainer.fit`` as
they are (Lightning neither copies nor re-samples a loader that is not a ``DataLoader``), with
``num_workers=2`` and lambda ``collate_fn`` s, as code written for DataLoader has them (the
workers fork, so the lambdas need not pickle: Linux's default start method). The source is a
map-style dataset with ``async def __getitem__`` and 2 ms of latency per sample, a stand-in for
an object store: the loader awaits many samples at once, the workers collate.

Lightning stores the train loader's ``state_dict()`` in every checkpoint and loads it when it
resumes mid-epoch, so the batches after ``--resume`` are those the uninterrupted run had.
``ResumeAtEpochEnd`` covers a checkpoint saved in an epoch's last batch, which Lightning 2.6
would resume into an empty epoch; docs/trainers.md has that and the other cases. ``--record
FILE`` writes each step's sample indices as JSON, to compare runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from asyncloader import AsyncLoader

FEATURES, LATENCY_S = 16, 0.002


class Regression:
    """Sample ``i``: ``(i, x, y)`` with ``y = x @ w + noise``, after ``LATENCY_S`` of waiting."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset
        self.w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        await asyncio.sleep(LATENCY_S)
        g = torch.Generator().manual_seed(self.offset + i)
        x = torch.randn(FEATURES, generator=g)
        return i, x, x @ self.w + 0.1 * torch.randn(1, generator=g)


class Model(L.LightningModule):
    """A small MLP; records the sample indices of every training step."""

    def __init__(self, steps_per_epoch: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))
        self.steps_per_epoch = steps_per_epoch
        self.seen: list[list[Any]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append([self.current_epoch, batch_idx, self.global_step, batch["idx"].tolist()])
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.net(batch["x"]), batch["y"]))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        # Steps from the loader's length, not trainer.estimated_stepping_batches: reading that
        # here makes Lightning 2.6 drop the loader's state on resume (docs/trainers.md).
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=3e-2,
            epochs=self.trainer.max_epochs,
            steps_per_epoch=self.steps_per_epoch,
        )
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]


class ResumeAtEpochEnd(Callback):
    """Hands Lightning the next epoch's start when a checkpoint from an epoch's last batch loads.

    A checkpoint saved in ``on_train_batch_end`` of an epoch's last batch
    (``ModelCheckpoint(every_n_train_steps=k)`` whenever a multiple of ``k`` ends an epoch)
    holds the loader's state with every batch of that epoch delivered. On resume Lightning
    counts the epoch as done and goes on to the next one without a new ``iter()``: the loader,
    whose epoch has nothing left, would give that next epoch no batch at all. This callback
    finishes the saved epoch on the loader itself and puts the state of the next epoch's start
    in the checkpoint, which Lightning then loads. Other checkpoints are left as they are.
    """

    def __init__(self, loader: AsyncLoader) -> None:
        self.loader = loader

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit_loop = checkpoint["loops"]["fit_loop"]
        states = fit_loop["state_dict"].get("combined_loader")
        progress = fit_loop["epoch_loop.batch_progress"]
        # Lightning's own test for this restart (training_epoch_loop.py, fit_loop.py): saved on
        # the last batch, before that batch was counted as completed.
        on_last_batch_end = progress["is_last_batch"] and (
            progress["total"]["completed"] < progress["total"]["processed"]
        )
        if states and on_last_batch_end:
            self.loader.load_state_dict(states[0])
            for _ in self.loader:  # what the saved epoch had left: nothing
                pass
            states[0] = self.loader.state_dict()  # the next epoch, from its start


def loaders(train_samples: int, val_samples: int) -> tuple[AsyncLoader, AsyncLoader]:
    """The train loader (shuffled, seeded) and the validation loader, lambdas and all."""
    train = AsyncLoader(
        Regression(train_samples),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(42),
        num_workers=2,
        collate_fn=lambda samples: {
            "idx": torch.tensor([s[0] for s in samples]),
            "x": torch.stack([s[1] for s in samples]),
            "y": torch.stack([s[2] for s in samples]),
        },
    )
    val = AsyncLoader(
        Regression(val_samples, offset=train_samples),
        batch_size=64,
        num_workers=2,
        collate_fn=lambda samples: {
            "x": torch.stack([s[1] for s in samples]),
            "y": torch.stack([s[2] for s in samples]),
        },
    )
    return train, val


class StopAfter(Callback):
    """Ends the run after ``step`` optimiser steps, as a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt-dir", type=Path, default=Path("lightning_ckpt"))
    parser.add_argument("--resume", type=Path, default=None, help="a checkpoint to resume from")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--save-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this step")
    parser.add_argument("--record", type=Path, default=None, help="write each step's samples")
    args = parser.parse_args()

    L.seed_everything(0)  # the model's initial weights; not workers=True (docs/trainers.md)
    train, val = loaders(args.samples, args.samples // 4)
    model = Model(steps_per_epoch=len(train))
    callbacks: list[Callback] = [
        ModelCheckpoint(
            args.ckpt_dir, "{step}", every_n_train_steps=args.save_every, save_top_k=-1
        ),
        ResumeAtEpochEnd(train),
    ]
    if args.stop_after is not None:
        callbacks.append(StopAfter(args.stop_after))
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=args.ckpt_dir,
    )
    started = time.perf_counter()
    trainer.fit(model, train, val, ckpt_path=args.resume)
    elapsed = time.perf_counter() - started
    steps, val_loss = len(model.seen), trainer.callback_metrics.get("val_loss")
    print(
        f"{steps} steps ({steps * train.batch_size / elapsed:,.0f} samples/s) in {elapsed:.1f} s"
        + (f", val_loss {val_loss:.4f}" if val_loss is not None else "")
        + f"; checkpoints in {args.ckpt_dir}"
    )
    if args.record is not None:
        args.record.write_text(json.dumps(model.seen))
    train.close()
    val.close()


if __name__ == "__main__":
    main()
