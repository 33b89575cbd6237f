"""Hugging Face ``datasets.IterableDataset`` (streaming) as an AsyncLoader source: the batches a
DataLoader gives, and an exact resume through the dataset's own ``state_dict``, with
``num_workers=0``, with ``fetch_in_workers=True`` (each worker streams its shards, as under a
DataLoader), and with workers that only collate (the stream pulled once, in this process).

A fresh interpreter per setting (tests/system/trainers/scripts/hf_datasets_job.py): 64 rows in 4
shards, batches of 8, 2 epochs, ``set_epoch`` before each; states cut at 1, 3 and 6 batches
into the first epoch, after it ended, and 5 batches into the second.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.trainers.jobs import run_script

pytest.importorskip("datasets")

SAMPLES = 64
SETTINGS = {
    "in-process": {"num_workers": 0},
    "fetch_in_workers": {"num_workers": 2, "fetch_in_workers": True},
    "collate-workers": {"num_workers": 2},
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_streaming_dataset_resumes_exactly(setting: str, tmp_path: Path) -> None:
    """Every epoch gives each row once (DataLoader's batches, where the stream is split the
    same way); the loader's state holds the dataset's own state where StatefulDataLoader puts
    it, and a new loader on a new dataset continues, from each cut, with the batches the
    uninterrupted run had."""
    options = SETTINGS[setting]
    [result] = run_script("hf_datasets_job", [options], tmp_path)
    full = result["full"]
    for epoch in full:
        assert sorted(i for batch in epoch for i in batch) == list(range(SAMPLES))
    if setting != "collate-workers":  # DataLoader's workers each stream their own shards
        assert full == result["dataloader"]
    assert result["layout"] == (
        "per worker" if options.get("fetch_in_workers") else "dataset_state"
    )
    for key, got in result["resumed"].items():
        epoch, taken = map(int, key.split(":"))
        assert got == [full[epoch][taken:], *full[epoch + 1 :]], key
