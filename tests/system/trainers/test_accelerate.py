"""Hugging Face ``accelerate`` with an AsyncLoader: ``prepare`` hands it back unchanged, the
loader partitions itself across ranks (``distributed=True``) and puts batches on
``accelerator.device``, and ``save_state``/``load_state`` resume it exactly once it is
registered with ``register_for_checkpointing``.

Jobs are fresh interpreters (tests/system/trainers/scripts/accelerate_job.py): 96 samples in batches
of 8, 2 workers, 2 epochs; alone, and at 2 ranks under torchrun (gloo, CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.trainers.jobs import run_script, torchrun

pytest.importorskip("accelerate")

SAMPLES, BATCH, EPOCHS = 96, 8, 2


def batches_of(steps: list, epoch: int) -> list:
    return [step[2] for step in steps if step[0] == epoch]


def test_resume_through_save_state_is_exact(tmp_path: Path) -> None:
    """prepare() returns the loader itself; its batches are a DataLoader's over a
    DistributedSampler with the same seed, on accelerator.device; load_state() of a
    save_state() from mid-epoch or from an epoch's last batch, in a new process, continues
    with the batches the uninterrupted loop had."""
    ckpt = tmp_path / "ckpt"
    [full] = run_script("accelerate_job", [{"ckpt_dir": str(ckpt), "save_at": [5, 12]}], tmp_path)
    assert full["prepared_is_loader"]
    assert full["device"] == ["cpu"]
    steps = full["steps"]
    assert [batches_of(steps, epoch) for epoch in range(EPOCHS)] == full["dataloader"]
    plan = [{"resume": str(ckpt / "step5")}, {"resume": str(ckpt / "step12")}]
    mid_epoch, epoch_end = run_script("accelerate_job", plan, tmp_path)
    assert mid_epoch["steps"] == steps[5:]
    assert epoch_end["steps"] == steps[12:]


def test_skip_first_batches_returns_a_dataloader(tmp_path: Path) -> None:
    """accelerate's skip_first_batches (the resume recipe for DataLoaders) does not keep an
    AsyncLoader: it builds a torch DataLoader from the loader's attributes, so load_state()
    with the loader registered is the way to resume it."""
    [run] = run_script("accelerate_job", [{"epochs": 0}], tmp_path)
    assert run["skip_type"] == "DataLoader"


def test_two_ranks_partition_and_resume(tmp_path: Path) -> None:
    """At 2 ranks each epoch is split between them, each sample once, as DistributedSampler
    splits it; rank 0's loader state, saved by save_state mid-epoch, loads on both ranks and
    each continues exactly."""
    ckpt = tmp_path / "ckpt"
    plan = [{"ckpt_dir": str(ckpt), "save_at": [8]}, {"resume": str(ckpt / "step8")}]
    ranks = torchrun(2, "accelerate_job", plan, tmp_path, timeout=110)
    for epoch in range(EPOCHS):
        taken = [i for full, _ in ranks for b in batches_of(full["steps"], epoch) for i in b]
        assert sorted(taken) == list(range(SAMPLES))
    for full, resumed in ranks:
        assert full["world_size"] == 2
        steps = full["steps"]
        assert len(steps) == EPOCHS * SAMPLES // (2 * BATCH)
        assert [batches_of(steps, epoch) for epoch in range(EPOCHS)] == full["dataloader"]
        assert resumed["steps"] == steps[8:]
