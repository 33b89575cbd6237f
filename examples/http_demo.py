"""HTTP demo: train a tiny model on images served over HTTP with 20 ms latency per request.

Generates a small image-like dataset (32x32 RGB, 10 classes), serves it from a local HTTP
server (its own process, 127.0.0.1, free port) that waits 20 ms before each response, and
trains a tiny model on it twice: reading through ``HTTPSource`` with AsyncLoader, and through
a plain ``urllib`` Dataset with DataLoader, on the same server. Prints samples/s for both.

Run with ``make demo`` (or ``python examples/http_demo.py``).
"""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import torch
from latency_server import LatencyServer
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from asyncloader import AsyncLoader
from asyncloader.sources import HTTPSource

N, SIDE, CLASSES, LATENCY_S = 2048, 32, 10, 0.020
BATCH, OURS_STEPS, THEIRS_STEPS = 32, 300, 40


def make_images(n: int, seed: int = 0) -> list[bytes]:
    """Image i: a class-dependent colour gradient plus noise; stored as label byte + pixels."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, SIDE, dtype=np.float32)
    bodies = []
    for i in range(n):
        label = i % CLASSES
        angle = 2 * np.pi * label / CLASSES
        base = np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None]
        pixels = np.stack([base, base.T, 1 - base]) * 100 + 80 + rng.normal(0, 25, (3, SIDE, SIDE))
        bodies.append(bytes([label]) + np.clip(pixels, 0, 255).astype(np.uint8).tobytes())
    return bodies


def decode(body: bytes) -> tuple[np.ndarray, int]:
    """Bytes to (3x32x32 uint8 image, label): cheap, so it may run on the event loop."""
    return np.frombuffer(body, np.uint8, offset=1).reshape(3, SIDE, SIDE).copy(), body[0]


class URLDataset(Dataset):
    """What DataLoader needs: a sync __getitem__ that blocks for the HTTP round trip."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        with urllib.request.urlopen(self.urls[index], timeout=30) as resp:
            return decode(resp.read())


def train(name: str, loader, steps: int) -> float:
    """Trains a fresh tiny model for ``steps`` batches; returns samples/s (data + training).
    The bar shows samples/s and ``wait``, the share of the time the step waited for data."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(3 * SIDE * SIDE, 64), nn.ReLU(), nn.Linear(64, CLASSES)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    seen, correct, step, waited = 0, 0, 0, 0.0
    start = time.perf_counter()
    with tqdm(total=steps, desc=f"{name:<34}", unit="step", leave=True) as bar:
        while step < steps:
            asked = time.perf_counter()
            for images, labels in loader:
                waited += time.perf_counter() - asked  # the step waited for data
                logits = model(images.float() / 255)
                loss = nn.functional.cross_entropy(logits, labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen += len(labels)
                correct += int((logits.argmax(1) == labels).sum())
                step += 1
                elapsed = time.perf_counter() - start
                bar.set_postfix(
                    loss=f"{loss.item():.3f}",
                    samples_s=f"{seen / elapsed:,.0f}",
                    wait=f"{waited / elapsed:.0%}",
                )
                bar.update()
                if step == steps:
                    break
                asked = time.perf_counter()
    rate = seen / (time.perf_counter() - start)
    print(f"  {name}: {seen} samples, running training accuracy {correct / seen:.0%}")
    return rate


def main() -> None:
    # One compute thread: the tiny model needs no more, and spare cores go to the IO (on a
    # 2-core machine, idle-spinning intra-op threads would slow the loader's loop thread).
    torch.set_num_threads(1)
    print(f"{N} images 3x{SIDE}x{SIDE}, {CLASSES} classes, {LATENCY_S * 1e3:.0f} ms per request")
    with LatencyServer(make_images(N), latency=LATENCY_S) as server:
        urls = server.urls()
        theirs = train(
            "DataLoader(num_workers=4)",
            DataLoader(URLDataset(urls), batch_size=BATCH, shuffle=True, num_workers=4),
            THEIRS_STEPS,
        )
        source = HTTPSource(urls, decode=decode)
        with AsyncLoader(source, batch_size=BATCH, shuffle=True, io_concurrency=64) as loader:
            ours = train("AsyncLoader(HTTPSource, io=64)", loader, OURS_STEPS)
    print(f"\nDataLoader(num_workers=4), {THEIRS_STEPS} steps: {theirs:8,.0f} samples/s")
    print(f"AsyncLoader(HTTPSource), {OURS_STEPS} steps:  {ours:8,.0f} samples/s", end="")
    print(f"  ({ours / theirs:.1f}x)")


if __name__ == "__main__":
    main()
