"""The Hugging Face ``Trainer`` on an AsyncLoader (tests/system/trainers/test_hf_trainer.py), runs
one
after the other in one interpreter, offline.

``python -m tests.system.trainers.scripts.hf_trainer_job PLAN OUT``: ``PLAN`` is a JSON list of
runs,
each a dict: ``output_dir``, ``loader`` ("async", or "torch" for a DataLoader with the same
arguments), ``resume`` (a checkpoint folder for ``train(resume_from_checkpoint=...)``),
``recipe`` (resume the docs' way: ``ignore_data_skip=True`` and the loader's own state, see
``resume_loader``), ``drain`` (``resume_loader``'s step for a checkpoint at an epoch's end;
on by default). Each run's result: ``steps``, ``[global_step, sample indices, whether the
batch came through the AsyncLoader]`` per training step (the loader's ``transform`` marks its
samples; a DataLoader made from its attributes has no transform).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from asyncloader import AsyncLoader

SAMPLES, BATCH, MAX_STEPS, SAVE_STEPS = 64, 8, 24, 4  # 8 steps an epoch, 3 epochs


class Samples(torch.utils.data.Dataset):
    """Sample ``i``: ``{"idx", "x", "y"}``, the same on every call."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        return {"idx": i, "x": torch.randn(4, generator=g), "y": torch.randn(1, generator=g)}


def mark(sample: dict[str, Any]) -> dict[str, Any]:
    """The loader's transform: marks samples that went through the AsyncLoader."""
    return {**sample, "via_asyncloader": True}


class Regression(nn.Module):
    """A linear model that returns ``{"loss": ...}``, as the Trainer wants."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, y, idx=None, via_asyncloader=None) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.linear(x), y)}


class AsyncLoaderTrainer(Trainer):
    """A Trainer that trains on the loader it is given; records each step's samples."""

    def __init__(self, *args: Any, train_loader: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader
        self.seen: list[list[Any]] = []

    def get_train_dataloader(self) -> Any:
        return self.train_loader

    def training_step(self, model: nn.Module, inputs: dict, num_items_in_batch=None):
        ids, via = inputs["idx"].tolist(), "via_asyncloader" in inputs
        self.seen.append([self.state.global_step, ids, via])
        return super().training_step(model, inputs, num_items_in_batch)


class LoaderState(TrainerCallback):
    """Saves the loader's ``state_dict()`` into every checkpoint folder."""

    def __init__(self, loader: AsyncLoader) -> None:
        self.loader = loader

    def on_save(self, args, state, control, **kwargs) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        (folder / "loader_state.json").write_text(json.dumps(self.loader.state_dict()))


def resume_loader(loader: AsyncLoader, checkpoint: Path, drain: bool = True) -> None:
    """Loads the loader state saved in ``checkpoint``. Saved at an epoch's last step, that
    epoch has nothing left: the Trainer, counting steps, would start its next epoch on the
    empty rest of it, so the rest is taken here and the next ``iter()`` starts the next epoch.
    """
    loader.load_state_dict(json.loads((checkpoint / "loader_state.json").read_text()))
    trainer_state = json.loads((checkpoint / "trainer_state.json").read_text())
    if drain and trainer_state["global_step"] % len(loader) == 0:  # gradient_accumulation_steps=1
        for _ in loader:
            pass


def train(run: dict[str, Any]) -> dict[str, Any]:
    make = AsyncLoader if run.get("loader", "async") == "async" else torch.utils.data.DataLoader
    options = {"transform": mark} if make is AsyncLoader else {}
    loader = make(
        Samples(),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=2,
        **options,
    )
    args = TrainingArguments(
        output_dir=run["output_dir"],
        max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS,
        use_cpu=True,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        ignore_data_skip=run.get("recipe", False),
    )
    callbacks = [LoaderState(loader)] if make is AsyncLoader else []
    trainer = AsyncLoaderTrainer(
        model=Regression(), args=args, train_loader=loader, callbacks=callbacks
    )
    resume = run.get("resume")
    if resume is not None and run.get("recipe"):
        resume_loader(loader, Path(resume), drain=run.get("drain", True))
    trainer.train(resume_from_checkpoint=resume)
    if make is AsyncLoader:
        loader.close()
    return {"steps": trainer.seen}


def main() -> None:
    plan, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps([train(run) for run in plan]))


if __name__ == "__main__":
    main()
