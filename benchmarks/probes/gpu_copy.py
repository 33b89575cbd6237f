"""Host-to-GPU copy: pageable vs pinned vs pinned in asyncloader's device thread.

For users with a GPU: ``python -m benchmarks.probes.gpu_copy [--batches 50] [--mib 64]``.
Prints, per way of copying, GB/s of the copy alone and the consumer's median wait for a batch
while it runs a fixed amount of compute per step (how well the copy overlaps with training).
The samples are the big workload's (:class:`benchmarks.workloads.BigSource`), sized so that
a batch of 8 holds ``--mib`` MiB, made in 2 worker processes. Without CUDA it says so and
exits.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from asyncloader import AsyncLoader
from benchmarks.loaders import CPU_WORKERS
from benchmarks.workloads import BigSource


def copy_rate(host: torch.Tensor, reps: int = 10) -> float:
    """GB/s of synchronous host-to-device copies of ``host``."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    return host.numel() * host.element_size() * reps / (time.perf_counter() - start) / 1e9


def step(x: torch.Tensor) -> torch.Tensor:
    """A training step's worth of compute, waited for."""
    for _ in range(20):
        x = x @ x / x.shape[0]
    torch.cuda.synchronize()
    return x


def waits(loader_or_batches, batches: int) -> tuple[float, float]:
    """(median wait for the next batch, total seconds) while computing between batches."""
    x = torch.randn(4096, 4096, device="cuda")
    out, start = [], time.perf_counter()
    it = iter(loader_or_batches)
    for _ in range(batches):
        t = time.perf_counter()
        batch = next(it)
        if batch.device.type != "cuda":
            batch = batch.to("cuda")
        out.append(time.perf_counter() - t)
        step(x)
    return statistics.median(out), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--mib", type=int, default=64, help="MiB per batch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available here: nothing to measure.")
        return
    batch_size = 8
    sample_bytes = args.mib * (1 << 20) // batch_size
    pageable = torch.zeros(batch_size, sample_bytes, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    print(f"{args.mib} MiB batches, {args.batches} steps, {torch.cuda.get_device_name()}")
    rates = copy_rate(pageable), copy_rate(pinned)
    print(f"copy alone: pageable {rates[0]:6.1f} GB/s, pinned {rates[1]:6.1f} GB/s")
    ds = BigSource(args.batches * batch_size, (sample_bytes,))
    for name, kwargs in [
        ("pageable, copied by the consumer", {}),
        ("pinned in thread, copied by the consumer", {"pin_memory": True}),
        ("pinned + copied on the device thread", {"pin_memory": True, "device": "cuda"}),
    ]:
        with AsyncLoader(ds, batch_size=batch_size, num_workers=CPU_WORKERS, **kwargs) as loader:
            wait, total = waits(loader, args.batches)
        print(f"{name:<42} median wait {wait * 1e3:7.2f} ms, epoch {total:6.2f} s")


if __name__ == "__main__":
    main()
