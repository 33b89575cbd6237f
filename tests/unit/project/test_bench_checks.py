"""The benchmark's delivery check: it accepts exactly samples 0..n-1, in any order, and
rejects missing, repeated, foreign and corrupted ones (benchmarks/checks.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from benchmarks.checks import Checker, DeliveryError, make_sample

SHAPE = (3, 8, 8)


def batches(indices: list[int], size: int = 4, shape: tuple[int, ...] = SHAPE) -> list:
    """Collated batches of the given samples, as a loader delivers them."""
    samples = [make_sample(i, shape) if shape else i for i in indices]
    return [default_collate(samples[k : k + size]) for k in range(0, len(samples), size)]


def check(indices: list[int], n: int = 10, shape: tuple[int, ...] = SHAPE) -> Checker:
    checker = Checker(n, shape)
    for batch in batches(indices, shape=shape):
        checker.add(batch)
    return checker


def test_sample_holds_its_index_and_fill():
    """A sample's first 4 bytes are its index (little-endian); the rest is index % 251."""
    s = make_sample(70_000, (1024,))
    assert s.dtype == np.uint8 and s.shape == (1024,)
    assert int.from_bytes(s[:4].tobytes(), "little") == 70_000
    assert (s[4:] == 70_000 % 251).all()


@pytest.mark.parametrize("shape", [SHAPE, (64,), ()])
def test_exact_delivery_in_any_order_passes(shape):
    """Every index once, shuffled, passes; so do bare-int samples (the overhead workload)."""
    order = list(np.random.default_rng(0).permutation(10))
    checker = check(order, shape=shape)
    checker.verify()
    assert checker.summary()["count"] == 10


def test_missing_sample_fails():
    """A sample never delivered fails, naming the count."""
    with pytest.raises(DeliveryError, match="delivered 9 samples, expected 10"):
        check(list(range(9))).verify()


def test_repeated_sample_fails():
    """The same sample twice in place of another fails even though the count is right."""
    with pytest.raises(DeliveryError, match="1 indices delivered more than once"):
        check([0, 1, 2, 3, 4, 5, 6, 7, 8, 8]).verify()


def test_foreign_index_fails():
    """An index outside 0..n-1 fails."""
    with pytest.raises(DeliveryError, match="outside"):
        check([*range(9), 12]).verify()


def test_corrupted_content_fails():
    """A sample whose header is right but whose bytes were overwritten fails the checksum."""
    checker = Checker(4, SHAPE)
    batch = default_collate([make_sample(i, SHAPE) for i in range(4)])
    batch[2, 1] = 0
    checker.add(batch)
    with pytest.raises(DeliveryError, match="content checksum"):
        checker.verify()


def test_wrong_shape_or_dtype_fails():
    """Batches of the wrong sample shape or dtype are rejected as they arrive."""
    checker = Checker(4, SHAPE)
    with pytest.raises(DeliveryError, match="shape"):
        checker.add(torch.zeros(4, 3, 8, 9, dtype=torch.uint8))
    with pytest.raises(DeliveryError, match="dtype"):
        checker.add(torch.zeros(4, *SHAPE, dtype=torch.float32))
