"""A webdataset pipeline passed as it is: iterated in the workers with fetch_in_workers=True
(as under DataLoader), and the warning when a sync iterable's work runs in the training
process instead."""

import hashlib
import os
import time
import warnings

import pytest
from torch.utils.data import DataLoader, IterableDataset

import asyncloader._pipeline.heavy_source as heavy
from asyncloader import AsyncLoader, SourceHeavyWarning
from asyncloader.images import ImageBatch
from examples.image_data import make_images, tar_shards

wds = pytest.importorskip("webdataset")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 WebDataset shards of 4 JPEG samples each, on disk."""
    where = tmp_path_factory.mktemp("shards")
    paths = []
    for i, data in enumerate(tar_shards(make_images(24, seed=2), per_shard=4)):
        path = where / f"shard-{i:02d}.tar"
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def key_and_pid(sample):
    return sample["__key__"], os.getpid()


def pipeline(paths):
    return wds.WebDataset(paths, shardshuffle=False, empty_check=False).map(key_and_pid)


def keys(batches):
    return [list(batch[0]) for batch in batches]


def test_a_webdataset_pipeline_runs_in_the_workers_in_dataloaders_order(shards):
    """Each of 2 workers iterates its own copy (webdataset splits the shards by
    get_worker_info()); the batches and their order are DataLoader's, every sample once."""
    expected = list(DataLoader(pipeline(shards), batch_size=4, num_workers=2))
    got = list(AsyncLoader(pipeline(shards), batch_size=4, num_workers=2, fetch_in_workers=True))
    assert keys(got) == keys(expected)
    assert sorted(k for batch in keys(got) for k in batch) == [f"{i:06d}" for i in range(24)]
    pids = {int(pid) for batch in got for pid in batch[1]}
    assert len(pids) == 2 and os.getpid() not in pids


def test_image_batches_from_a_webdataset_pipeline_in_the_workers(shards):
    source = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    loader = AsyncLoader(
        source, batch_size=4, num_workers=2, fetch_in_workers=True, collate_fn=ImageBatch(32)
    )
    batches = list(loader)
    assert all(images.shape == (4, 3, 32, 32) for images, _ in batches)
    assert sorted(int(x) for _, labels in batches for x in labels) == sorted(
        i % 10 for i in range(24)
    )


class Burning(IterableDataset):
    """Each item costs CPU in __next__ (hashing), as decoding in __iter__ would."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            hashlib.sha256(b"x" * 1_500_000).digest()
            yield i


class Waiting(IterableDataset):
    """Each item waits (as on IO) without using CPU."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            time.sleep(0.002)
            yield i


@pytest.fixture
def quick_meter(monkeypatch):
    """The meter judges after 0.2 s (not 2 s), at 20% of the time (robust on a busy CI)."""
    monkeypatch.setattr(heavy, "MIN_WALL_S", 0.2)
    monkeypatch.setattr(heavy, "SHARE", 0.2)


def epoch_warnings(loader):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sorted(x for batch in loader for x in batch.tolist()) == list(range(300))
    return [w for w in caught if issubclass(w.category, SourceHeavyWarning)]


def test_a_heavy_iterable_in_the_training_process_is_named_once(quick_meter):
    loader = AsyncLoader(Burning(300), batch_size=10, num_workers=2)
    first = epoch_warnings(loader)
    assert len(first) == 1
    message = str(first[0].message)
    assert "Burning" in message and "fetch_in_workers=True" in message and "%" in message
    assert epoch_warnings(loader) == []  # once per source


def test_an_iterable_that_waits_is_not_called_heavy(quick_meter):
    assert epoch_warnings(AsyncLoader(Waiting(300), batch_size=10)) == []
