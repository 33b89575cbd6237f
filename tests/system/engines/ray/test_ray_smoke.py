"""RayEngine on a local Ray cluster, once: a shuffled map-style epoch on two actors comes in
DataLoader's order, and the actors give their CPUs back. The engine's whole contract matrix,
resume, crashes and transports run in tests/stress/engines/ray/test_ray.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

ray = pytest.importorskip("ray")

from asyncloader import AsyncLoader  # noqa: E402
from asyncloader.ray import RayEngine  # noqa: E402
from tests.helpers import SyncSource, indices_of  # noqa: E402
from tests.stress.engines.ray.test_ray import all_cpus_free  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def test_a_shuffled_epoch_on_two_actors_comes_in_dataloaders_order():
    """Two actors over Unix sockets: DataLoader's shuffled order; the CPUs free after close."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        made = AsyncLoader(
            SyncSource(40), batch_size=4, shuffle=True, engine=RayEngine(2),
            generator=torch.Generator().manual_seed(5),
        )  # fmt: skip
        with made:
            got = indices_of(made)
        reference = DataLoader(
            range(40), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
        assert got == [int(i) for batch in reference for i in batch]
        assert all_cpus_free(), "the epoch's actors were not released"
    finally:
        ray.shutdown()
