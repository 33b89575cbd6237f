"""The Hugging Face ``Trainer`` (transformers) with ``get_train_dataloader`` overridden to return
an AsyncLoader: what its resume does to the loader, and the resume that is exact.

One job (tests/system/trainers/scripts/hf_trainer_job.py), offline, runs every training one after
the
other in a fresh interpreter: 64 samples in batches of 8 (8 steps an epoch), 24 steps, a
checkpoint every 4; a tiny linear model that returns ``{"loss": ...}``; ``use_cpu=True``.
"""

from __future__ import annotations

import pytest

from tests.system.trainers.jobs import run_script

pytest.importorskip("transformers")

SAMPLES, STEPS_PER_EPOCH, MAX_STEPS = 64, 8, 24


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Each training's steps: the uninterrupted one (which saves the checkpoints), one on a
    DataLoader, and resumes from step 12 (mid-epoch) and 16 (an epoch's end)."""
    tmp = tmp_path_factory.mktemp("hf_trainer")
    full = str(tmp / "full")

    def resumed(step: int, **options: object) -> dict:
        return {"output_dir": str(tmp / f"resumed-{len(plan)}"), **options,
                "resume": f"{full}/checkpoint-{step}"}  # fmt: skip

    plan: list[dict] = [{"output_dir": full}]
    plan.append({"output_dir": str(tmp / "dataloader"), "loader": "torch"})
    plan.append(resumed(12))
    plan.append(resumed(12, recipe=True))
    plan.append(resumed(16, recipe=True))
    plan.append(resumed(16, recipe=True, drain=False))
    names = ["full", "dataloader", "default_12", "recipe_12", "recipe_16", "undrained_16"]
    results = run_script("hf_trainer_job", plan, tmp, timeout=110)
    return {name: result["steps"] for name, result in zip(names, results, strict=True)}


def test_trains_on_the_asyncloader_as_on_a_dataloader(runs: dict[str, list]) -> None:
    """Every step's batch comes through the AsyncLoader, each epoch takes every sample once,
    and the batches are those of a DataLoader with the same arguments and generator seed."""
    full = runs["full"]
    assert [step[0] for step in full] == list(range(MAX_STEPS))
    assert all(via for _, _, via in full)
    for epoch in range(MAX_STEPS // STEPS_PER_EPOCH):
        steps = full[epoch * STEPS_PER_EPOCH : (epoch + 1) * STEPS_PER_EPOCH]
        assert sorted(i for step in steps for i in step[1]) == list(range(SAMPLES))
    assert [step[1] for step in full] == [step[1] for step in runs["dataloader"]]


def test_default_resume_replaces_the_loader_with_a_dataloader(runs: dict[str, list]) -> None:
    """train(resume_from_checkpoint=...) mid-epoch calls accelerate's skip_first_batches,
    which builds a torch DataLoader from the loader's attributes: the rest of the epoch skips
    the loader's transform and repeats the first epoch's order from the loader's fresh
    generator; the epochs after come from the loader again, one epoch behind (the DataLoader
    drew its epoch from the generator the loader shares)."""
    full, resumed = runs["full"], runs["default_12"]
    rest = STEPS_PER_EPOCH - 12 % STEPS_PER_EPOCH
    assert [step[0] for step in resumed] == list(range(12, MAX_STEPS))
    assert not any(via for _, _, via in resumed[:rest])
    assert all(via for _, _, via in resumed[rest:])
    assert [step[1] for step in resumed[:rest]] == [step[1] for step in full[4:STEPS_PER_EPOCH]]
    assert [step[1] for step in resumed[rest:]] == [step[1] for step in full[8:16]]


@pytest.mark.parametrize("step", [12, 16])
def test_resume_with_the_loaders_own_state_is_exact(runs: dict[str, list], step: int) -> None:
    """ignore_data_skip=True and the loader's state_dict() saved in each checkpoint (a
    TrainerCallback's on_save) and loaded before train(): the resumed steps are the
    uninterrupted run's, on the AsyncLoader, mid-epoch and from an epoch's last step."""
    assert runs[f"recipe_{step}"] == runs["full"][step:]


def test_resume_at_an_epochs_end_needs_the_rest_taken(runs: dict[str, list]) -> None:
    """The Trainer never asks the loader past an epoch's last batch: a state saved there,
    loaded as it is, gives the next epoch no batch and the Trainer stops training."""
    assert runs["undrained_16"] == []
