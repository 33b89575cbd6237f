"""torch's default_collate as asyncloader runs it: collate_small (numpy samples stacked at
once) and private_collate (a worker's small batch in private memory, not shared memory)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import worker as torch_worker

from asyncloader._worker import collate as collate_module
from asyncloader._worker.collate import collate_small, private_collate, worker_collate

Pair = namedtuple("Pair", "a b")


@pytest.mark.parametrize(
    "samples",
    [
        [np.arange(6, dtype=np.uint8).reshape(2, 3) + i for i in range(4)],
        [np.full(5, i, dtype=np.float32) for i in range(3)],
        [np.array([True, False]), np.array([False, False])],
        [np.arange(3, dtype=np.int64)],
    ],
)
def test_collate_small_equals_default_collate_on_numeric_arrays(samples):
    """The numpy fast path gives default_collate's values, dtype and shape."""
    fast, slow = collate_small(samples), default_collate(samples)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    assert torch.equal(fast, slow)


@pytest.mark.parametrize(
    "samples",
    [
        [{"x": np.zeros(2)}, {"x": np.ones(2)}],  # not arrays: default_collate's walk
        [np.zeros(2, dtype=np.uint8), np.zeros(2, dtype=np.int16)],  # mixed dtypes
        [1, 2, 3],
    ],
)
def test_collate_small_defers_everything_else_to_default_collate(samples):
    """Anything but same-shape numeric native arrays gets exactly default_collate's result."""
    fast, slow = collate_small(samples), default_collate(samples)
    assert type(fast) is type(slow)
    if isinstance(slow, dict):
        assert torch.equal(fast["x"], slow["x"])
    else:
        assert torch.equal(torch.as_tensor(fast), torch.as_tensor(slow))


def test_collate_small_keeps_default_collates_errors():
    """Ragged or non-native samples raise default_collate's own errors, not numpy's."""
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        collate_small([np.zeros(2), np.zeros(3)])
    with pytest.raises(ValueError, match="byte order different from the native"):
        collate_small([np.zeros(2, dtype=">i4"), np.zeros(2, dtype=">i4")])


@pytest.fixture
def in_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's get_worker_info() answers, as in a worker: default_collate then stacks tensors
    into shared memory; asyncloader's shares_batches() answers yes."""
    info = torch_worker.WorkerInfo(id=0, num_workers=2, seed=0, dataset=None)
    monkeypatch.setattr(torch_worker, "_worker_info", info)
    monkeypatch.setattr(collate_module, "shares_batches", lambda: True)


def _leaves(x: object) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    return []


CASES = [
    [np.arange(6, dtype=np.uint8).reshape(2, 3) + i for i in range(4)],
    [{"x": np.full(3, i, dtype=np.float32), "y": i, "name": f"s{i}"} for i in range(5)],
    [(torch.full((2, 2), float(i)), np.int64(i)) for i in range(3)],
    [Pair(torch.arange(3) + i, [np.zeros(2, dtype=np.int16)]) for i in range(2)],
    [np.zeros(2, dtype=np.uint8), np.zeros(2, dtype=np.int16)],  # mixed dtypes
    [np.arange(8)[::2] + i for i in range(3)],  # not contiguous
    [1.5, 2.5],
]


@pytest.mark.parametrize("samples", CASES)
def test_private_collate_equals_default_collate_in_private_memory(samples, in_a_worker):
    """The same containers, values, dtypes and shapes as default_collate outside a worker,
    and no tensor in shared memory even where default_collate would put them there."""
    info, torch_worker._worker_info = torch_worker._worker_info, None
    try:
        reference = default_collate(samples)
    finally:
        torch_worker._worker_info = info
    got = private_collate(samples)
    assert type(got) is type(reference)
    for ours, theirs in zip(_leaves(got), _leaves(reference), strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
        assert not ours.is_shared()


def test_private_collate_keeps_default_collates_errors():
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        private_collate([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(TypeError):
        private_collate([np.array(["a"]), np.array(["b"])])


def test_worker_collate_small_private_large_shared(in_a_worker):
    """In a worker: a batch that travels by value is collated privately; one of 1 MiB or
    more goes to default_collate, straight into shared memory; a user's collate is kept."""
    run = worker_collate(default_collate)
    small = run([np.zeros(64, dtype=np.uint8) for _ in range(32)])
    large = run([torch.zeros(64 * 1024) for _ in range(8)])  # 2 MiB of float32
    assert not small.is_shared() and large.is_shared()

    def mine(samples):
        return samples

    assert worker_collate(mine) is mine


def test_worker_collate_outside_a_worker_is_default_collate():
    assert worker_collate(default_collate) is default_collate
