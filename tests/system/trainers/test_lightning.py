"""PyTorch Lightning (``lightning``) with AsyncLoaders: ``Trainer.fit`` on them as they are,
and an exact resume through Lightning's own checkpoints.

Each job is a fresh interpreter (tests/system/trainers/scripts/lightning_job.py): 96 training
samples in batches of 8 (12 steps an epoch), 2 epochs, 2 workers per loader, lambda collate
functions. The reference run saves a checkpoint every 5 steps, every 12 (in an epoch's last
batch) and after each epoch (ModelCheckpoint's default); the resumed runs start from those in
new processes and must see, step by step, the batches the reference saw.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

from tests.system.trainers.jobs import run_job, run_script, script_result

pytest.importorskip("lightning")

EPOCHS, STEPS_PER_EPOCH, TRAIN_SAMPLES, BATCH = 2, 12, 96, 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    """An uninterrupted shuffled run: its steps, and the folder of its checkpoints."""
    tmp = tmp_path_factory.mktemp("lightning_reference")
    plan = [
        {"ckpt_dir": str(tmp / "ckpt"), "ckpt_every": [5, STEPS_PER_EPOCH], "ckpt_epochs": True}
    ]
    [run] = run_script("lightning_job", plan, tmp)
    return run["train"], tmp / "ckpt"


def after(steps: list, global_step: int) -> list:
    return [step for step in steps if step[2] >= global_step]


def test_fit_keeps_the_loaders_and_matches_dataloader(tmp_path: Path) -> None:
    """Trainer.fit trains and validates on the AsyncLoader objects themselves, and sees per
    step the batches a DataLoader with the same arguments gives."""
    plan = [{"loader": kind, "shuffle": False} for kind in ("async", "torch")]
    ours, theirs = run_script("lightning_job", plan, tmp_path)
    assert ours["kept"] == [True, True]
    assert ours["train"] == theirs["train"]
    assert len(ours["train"]) == EPOCHS * STEPS_PER_EPOCH
    assert ours["val"] == theirs["val"]  # the sanity check's 2 batches, then 2 per epoch
    assert len(ours["val"]) == 2 + 2 * EPOCHS


def test_shuffled_epochs_take_each_sample_once(reference: tuple[list, Path]) -> None:
    """Each epoch of a shuffled fit is a new order of every sample, each once."""
    steps, _ = reference
    assert len(steps) == EPOCHS * STEPS_PER_EPOCH
    orders = [[i for step in steps if step[0] == epoch for i in step[3]] for epoch in range(2)]
    assert [sorted(order) for order in orders] == [list(range(TRAIN_SAMPLES))] * EPOCHS
    assert orders[0] != orders[1]


def test_killed_mid_epoch_resumes_exactly(reference: tuple[list, Path], tmp_path: Path) -> None:
    """A run SIGKILLed at step 7 resumes from its step-5 checkpoint, in a new process, with
    the batches the uninterrupted run had from step 5 on, through the next epoch."""
    steps, _ = reference
    ckpt = tmp_path / "ckpt"
    plan = [{"ckpt_dir": str(ckpt), "ckpt_every": [5], "kill_at": 7}]
    run_script("lightning_job", plan, tmp_path, returncode=-9)
    [resumed] = run_script(
        "lightning_job", [{"resume": str(ckpt / "every5/step=5.ckpt")}], tmp_path
    )
    assert resumed["train"] == after(steps, 5)


def test_resume_in_the_second_epoch_is_exact(reference: tuple[list, Path], tmp_path: Path) -> None:
    """Resuming mid-way through the second epoch continues that epoch's order, not the
    first's: the loader's state carries the epoch and its RNG."""
    steps, ckpt = reference
    [resumed] = run_script(
        "lightning_job", [{"resume": str(ckpt / "every5/step=15.ckpt")}], tmp_path
    )
    assert resumed["train"] == after(steps, 15)
    assert resumed["train"][0][:3] == [1, 3, 15]


def test_checkpoints_at_an_epochs_end(reference: tuple[list, Path], tmp_path: Path) -> None:
    """Saved in the last batch of epoch 0 (every_n_train_steps): Lightning goes on to epoch 1
    without a new iter(), so the loader, its epoch spent, gives epoch 1 nothing and the fit
    ends an epoch short; the example's ResumeAtEpochEnd makes that resume exact. Saved after
    the epoch (ModelCheckpoint's default): Lightning does not load the loader's state at all,
    and epoch 1 gets the order the loader's first epoch had, as a new DataLoader's would,
    unless the training is iteration-based (max_steps), which loads it: exact again."""
    steps, ckpt = reference
    last_batch = str(ckpt / f"every{STEPS_PER_EPOCH}/step={STEPS_PER_EPOCH}.ckpt")
    after_epoch = str(ckpt / f"epochs/step={STEPS_PER_EPOCH}.ckpt")
    plan = [
        {"resume": last_batch},
        {"resume": last_batch, "epoch_end_fix": True},
        {"resume": after_epoch, "epoch_end_fix": True},
        {"resume": after_epoch, "epoch_end_fix": True, "max_steps": EPOCHS * STEPS_PER_EPOCH},
    ]
    plain, fixed, epoch_end, by_steps = run_script("lightning_job", plan, tmp_path)
    assert plain["train"] == []
    assert fixed["train"] == after(steps, STEPS_PER_EPOCH)
    first_epoch = [step[3] for step in steps[:STEPS_PER_EPOCH]]
    assert [step[3] for step in epoch_end["train"]] == first_epoch
    assert by_steps["train"] == after(steps, STEPS_PER_EPOCH)


def test_estimated_stepping_batches_drops_the_loader_state(
    reference: tuple[list, Path], tmp_path: Path
) -> None:
    """Reading trainer.estimated_stepping_batches in configure_optimizers builds the train
    loader before the checkpoint is restored, and Lightning 2.6 then never loads the loader's
    state (Lightning issue 20550): the resumed steps get the epoch from its first batch. Sizing
    the schedule from len(loader) instead resumes exactly."""
    steps, ckpt = reference
    resume = str(ckpt / "every5/step=5.ckpt")
    plan = [{"resume": resume, "schedule": "estimated"}, {"resume": resume, "schedule": "len"}]
    estimated, sized = run_script("lightning_job", plan, tmp_path)
    first_epoch_rest = STEPS_PER_EPOCH - 5
    got = [step[3] for step in estimated["train"][:first_epoch_rest]]
    assert got == [step[3] for step in steps[:first_epoch_rest]]  # from batch 0 again
    assert sized["train"] == after(steps, 5)


def test_a_stream_without_length_loses_a_batch_on_resume(tmp_path: Path) -> None:
    """With an iterable source without __len__ the loader has no length, and Lightning's
    fetcher takes one batch ahead of the training step (fetchers.py): the checkpoint's loader
    state counts that batch as received, so a mid-epoch resume goes on one batch later."""
    ckpt = tmp_path / "ckpt"
    stream = {"stream": True, "shuffle": False}
    plan = [{**stream, "ckpt_dir": str(ckpt), "ckpt_every": [5]}]
    plan.append({**stream, "resume": str(ckpt / "every5/step=5.ckpt")})
    full, resumed = run_script("lightning_job", plan, tmp_path)
    ids = [step[3] for step in full["train"]]
    assert ids[:STEPS_PER_EPOCH] == [list(range(i, i + BATCH)) for i in range(0, 96, BATCH)]
    assert [step[3] for step in resumed["train"]][:3] == ids[6:9]  # ids[5] is never trained on


def test_ddp_ranks_split_the_epoch(tmp_path: Path) -> None:
    """Under DDP (2 ranks on CPU, Lightning starting the second) a distributed=True loader is
    left as it is (no DistributedSampler put in) and splits each epoch as DistributedSampler
    does: Lightning's epoch e is the loader's epoch e + 1, since Lightning calls iter() once on
    a loader that is not a DataLoader before training, to check it is iterable."""
    out = script_result(tmp_path)
    plan = '[{"devices": 2, "epochs": 1}]'  # 6 steps a rank
    run_job(["-m", "tests.system.trainers.scripts.lightning_job", plan, str(out)], tmp_path)
    ranks = [json.loads(Path(f"{out}.{rank}").read_text())[0] for rank in range(2)]
    assert [run["kept"] for run in ranks] == [[True, True]] * 2
    for rank, run in enumerate(ranks):
        sampler = DistributedSampler(range(TRAIN_SAMPLES), 2, rank, shuffle=True, seed=0)
        sampler.set_epoch(1)
        order = list(sampler)
        expected = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
        assert [step[3] for step in run["train"]] == expected


def test_example_resumes_exactly(tmp_path: Path) -> None:
    """examples/lightning_train.py trains (async source, lambdas, two workers) and a resume
    from its step-15 checkpoint sees the batches the full run saw from step 15 on."""
    example = "examples/lightning_train.py"
    common = ["--samples", "256", "--epochs", "2", "--ckpt-dir", str(tmp_path / "ckpt")]
    full, resumed = tmp_path / "full.json", tmp_path / "resumed.json"
    out = run_job([example, *common, "--record", str(full)], tmp_path)
    assert "16 steps" in out
    ckpt = str(tmp_path / "ckpt" / "step=15.ckpt")
    run_job([example, *common, "--resume", ckpt, "--record", str(resumed)], tmp_path)
    assert json.loads(resumed.read_text()) == json.loads(full.read_text())[15:]
