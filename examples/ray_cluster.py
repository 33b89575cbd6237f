"""asyncloader's workers on a Ray cluster: ``AsyncLoader(..., engine=RayEngine(...))``.

Local (starts a Ray instance on this machine)::

    python examples/ray_cluster.py

On a multi-node cluster, from a node of it (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others; asyncloader and this file importable on every node)::

    python examples/ray_cluster.py --address auto --workers 16

Each actor fetches its share of the samples on its own event loop (here: 20 ms of simulated
storage latency each), augments and collates them; the training loop below only receives
batches. The dataset and transform reach each actor once. Ctrl-C stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import ray
import torch

from asyncloader import AsyncLoader
from asyncloader.ray import RayEngine


class RemoteImages:
    """Stands in for images behind an object store: 20 ms per request, 3x64x64 bytes each."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        await asyncio.sleep(0.020)
        return np.random.default_rng(index).integers(0, 256, (3, 64, 64), dtype=np.uint8)


def augment(image: np.ndarray) -> torch.Tensor:
    """A random flip and a float conversion, drawn from the worker's seeded global RNG."""
    x = torch.from_numpy(image).float().div_(255)
    return x.flip(-1) if torch.rand(()) < 0.5 else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default=None, help="a Ray cluster ('auto': this node's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    ray.init(address=args.address, num_cpus=None if args.address else args.workers)
    loader = AsyncLoader(
        RemoteImages(args.samples), batch_size=64, shuffle=True, transform=augment,
        io_concurrency=512 * args.workers, persistent_workers=True,
        generator=torch.Generator().manual_seed(0), engine=RayEngine(num_workers=args.workers),
    )  # fmt: skip
    with loader:
        for epoch in range(args.epochs):
            t0, seen = time.perf_counter(), 0
            for batch in loader:
                seen += len(batch)  # a training step would go here
            rate = seen / (time.perf_counter() - t0)
            print(f"epoch {epoch}: {seen} samples, {rate:,.0f} samples/s on {args.workers} actors")
    ray.shutdown()


if __name__ == "__main__":
    main()
