"""A dataset's shared-list field under spawned workers (fresh interpreters); the rest:
tests/integration/base/test_shared_list.py."""

from __future__ import annotations

import torch

from asyncloader import AsyncLoader, SharedList
from tests.integration.base.test_shared_list import Records


def test_a_field_of_a_dataset_under_spawned_workers():
    """A spawned worker receives the buffer in shared memory (the parent's moves there once).
    One worker: a spawned worker imports torch afresh, seconds of CI time each."""
    values = [f"record {i}" * (i % 7) for i in range(1000)]
    dataset = Records(SharedList(values))
    assert not dataset.records.is_shared()
    loader = AsyncLoader(dataset, batch_size=64, num_workers=1, mp_context="spawn")
    ids, lengths, shared, _, _ = (torch.cat(t) for t in zip(*loader, strict=True))
    assert ids.tolist() == list(range(1000))
    assert lengths.tolist() == [len(v) for v in values]
    assert shared.all()
    assert dataset.records.is_shared()
    assert list(dataset.records) == values
