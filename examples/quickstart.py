"""Quickstart: the same latency-bound dataset through DataLoader and through AsyncLoader.

Each sample takes 20 ms to arrive, as from an object store. DataLoader hides that latency
with worker processes (one request in flight per worker); AsyncLoader keeps io_concurrency
requests in flight on one event loop.

Run with ``make demo`` (or ``python examples/quickstart.py``).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from asyncloader import AsyncLoader

N, BATCH, LATENCY_S = 640, 32, 0.020


class BlockingStore(Dataset):
    """What DataLoader needs: a sync __getitem__ that blocks for the round trip."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> np.ndarray:
        time.sleep(LATENCY_S)
        return np.full(1024, index % 256, dtype=np.uint8)


class AsyncStore:
    """The same store, with the round trip awaited instead of blocked on."""

    def __len__(self) -> int:
        return N

    async def __getitem__(self, index: int) -> np.ndarray:
        await asyncio.sleep(LATENCY_S)
        return np.full(1024, index % 256, dtype=np.uint8)


def measure(name: str, loader) -> float:
    """Iterates one epoch with a progress bar and returns samples per second."""
    start, seen = time.perf_counter(), 0
    with tqdm(total=N, desc=f"{name:<32}", unit="sample", leave=True) as bar:
        for batch in loader:
            seen += len(batch)
            bar.update(len(batch))
    rate = seen / (time.perf_counter() - start)
    assert seen == N, f"{name} delivered {seen} samples, expected {N}"
    return rate


def main() -> None:
    print(f"{N} samples, {LATENCY_S * 1000:.0f} ms latency each, batches of {BATCH}\n")
    base = measure(
        "DataLoader(num_workers=2)", DataLoader(BlockingStore(), batch_size=BATCH, num_workers=2)
    )
    with AsyncLoader(AsyncStore(), batch_size=BATCH, io_concurrency=64) as loader:
        ours = measure("AsyncLoader(io_concurrency=64)", loader)
    print(f"\nDataLoader(num_workers=2):      {base:8.0f} samples/s")
    print(f"AsyncLoader(io_concurrency=64): {ours:8.0f} samples/s  ({ours / base:.1f}x)")


if __name__ == "__main__":
    main()
