"""The JPEG-shards probe's building blocks (benchmarks/probes/jpeg_shards.py) on 40 images: every
pipeline delivers every image exactly once, and its check rejects what it must. No timing."""

from __future__ import annotations

import random

import pytest
import torch

from benchmarks.probes import jpeg_shards as probe
from examples.image_data import make_images, tar_shards
from examples.latency_server import LatencyServer

IMAGES = 40
PER_SHARD = 10


@pytest.fixture(scope="module")
def shards() -> list[bytes]:
    return tar_shards(make_images(IMAGES, seed=0), PER_SHARD)


@pytest.fixture(scope="module")
def urls(shards):
    with LatencyServer(shards, latency=0.0) as server:
        yield server.urls()


@pytest.fixture(scope="module")
def samples(shards, tmp_path_factory) -> list[dict]:
    where = tmp_path_factory.mktemp("shards")
    paths = []
    for i, shard in enumerate(shards):
        paths.append(where / f"shard-{i:06d}.tar")
        paths[-1].write_bytes(shard)
    return probe.read_samples(paths)


@pytest.mark.parametrize("name", list(probe.PIPELINES))
def test_every_pipeline_delivers_every_image_once(name, urls, monkeypatch):
    """Batches of 8 over 4 shards of 10: full and partial batches, 1 or 2 workers."""
    monkeypatch.setattr(probe, "BATCH", 8)
    checker = probe.ImageChecker(probe.expected_keys(IMAGES))
    with probe.PIPELINES[name](urls) as batches:
        for batch in batches:
            checker.add(batch)
    checker.verify()
    assert checker.summary()["images"] == IMAGES


def test_reference_transform_and_image_batch_alone(samples):
    """What "decode alone" times: both transforms pass the check, uint8 through Normalize."""
    from asyncloader.images import Normalize

    assert [s["__key__"] for s in samples] == probe.expected_keys(IMAGES)
    random.seed(0)
    checker = probe.ImageChecker(probe.expected_keys(IMAGES))
    for s in samples:
        image, label = probe.reference_transform(s)
        assert image.is_contiguous() and label == int(s["__key__"]) % 10
        checker.add((image[None], [label], [s["__key__"]]))
    checker.verify()
    for options in probe.ALONE_CASES.values():
        if options is None:
            continue
        checker = probe.ImageChecker(probe.expected_keys(IMAGES))
        collate, normalize = probe.KeyedImageBatch(**options), Normalize()
        for i in range(0, IMAGES, 16):
            checker.add(normalize(collate(samples[i : i + 16])))
        checker.verify()


def _batch(keys: list[str], labels: list[int] | None = None, dtype=torch.float32):
    images = torch.zeros(len(keys), 3, probe.SIZE, probe.SIZE, dtype=dtype)
    return images, labels if labels is not None else [int(k) % 10 for k in keys], keys


def test_checker_rejects_missing_repeated_mislabelled_and_malformed():
    keys = probe.expected_keys(4)
    checker = probe.ImageChecker(keys)
    checker.add(_batch(keys[:3]))
    with pytest.raises(probe.DeliveryError, match="1 missing"):
        checker.verify()
    checker.add(_batch(keys[2:]))
    with pytest.raises(probe.DeliveryError, match="1 repeated"):
        checker.verify()
    with pytest.raises(probe.DeliveryError, match="labels"):
        probe.ImageChecker(keys).add(_batch(keys, labels=[0, 0, 0, 0]))
    with pytest.raises(probe.DeliveryError, match="images"):
        probe.ImageChecker(keys).add(_batch(keys, dtype=torch.uint8))
    images, labels, _ = _batch(keys)
    images[0, 0, 0, 0] = float("nan")
    with pytest.raises(probe.DeliveryError, match="range"):
        probe.ImageChecker(keys).add((images, labels, keys))
