"""Train a small CNN on JPEG shards served over HTTP: the recommended image pipeline end to end.

Generates WebDataset tar shards of deterministic JPEGs (``image_data.py``, cached under
``.cache/image_shards``), serves them from a local HTTP server (its own process, 127.0.0.1, a
free port) that waits 20 ms before each response, and trains a small CNN for a fixed number
of steps on::

    ShardedSource(urls, samples_per_shard=counts)          # 100 a shard, the last fewer
    AsyncLoader(..., num_workers=2, fetch_in_workers=True,
                collate_fn=ImageBatch(SIZE, output="uint8"),  # decode + crop + flip, uint8
                device=DEVICE, device_transform=Normalize())  # normalised on the device

The progress bar shows images/s and the share of the time the model waited for data
(``wait``): near 0 the loader keeps up, near 100% the model waits on input. It is a pipeline
demo: the images' labels are ``i % 10``, not in their pixels, so the loss stays near ln 10.
``--checkpoint PATH`` saves model, optimiser and loader together at the end; run again with
the same path to resume from there, the loader where it stopped.

``python examples/train_images.py [--images 2000] [--steps 60] [--size 128]
[--checkpoint PATH]``
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from image_data import cached_shards, shard_sizes
from latency_server import LatencyServer
from torch import nn
from tqdm import tqdm

from asyncloader import AsyncLoader
from asyncloader.images import ImageBatch, Normalize
from asyncloader.sources import ShardedSource

PER_SHARD, CLASSES, LATENCY_S, BATCH = 100, 10, 0.020, 64


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU())

    return nn.Sequential(
        block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, CLASSES),
    )  # fmt: skip


def train(loader: AsyncLoader, steps: int, device: torch.device, checkpoint: str | None) -> None:
    torch.manual_seed(0)
    model = small_cnn().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=True)  # plain data: no pickled code
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step} from {checkpoint}")
    seen, waited = 0, 0.0
    start = time.perf_counter()
    with tqdm(total=steps, initial=step, unit="step") as bar:
        while step < steps:
            before = time.perf_counter()
            for images, labels in loader:
                waited += time.perf_counter() - before
                loss = nn.functional.cross_entropy(model(images), labels.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
                step, seen = step + 1, seen + len(labels)
                elapsed = time.perf_counter() - start
                bar.set_postfix(
                    loss=f"{loss.item():.3f}",
                    images_s=f"{seen / elapsed:,.0f}",
                    wait=f"{waited / elapsed:.0%}",
                )
                bar.update()
                if step == steps:
                    break
                before = time.perf_counter()
    if checkpoint:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        torch.save({**state, "loader": loader.state_dict(), "step": step}, checkpoint)
        print(f"saved model, optimiser and loader at step {step} to {checkpoint}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--size", type=int, default=128, help="crop side in pixels")
    parser.add_argument("--checkpoint", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the workers have the other cores
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    paths = cached_shards(args.images, PER_SHARD)
    counts = shard_sizes(args.images, PER_SHARD)  # the last shard holds the rest
    print(f"{args.images} JPEGs in {len(paths)} shards, {LATENCY_S * 1e3:.0f} ms per request")
    with LatencyServer([p.read_bytes() for p in paths], latency=LATENCY_S) as server:
        source = ShardedSource(server.urls(), samples_per_shard=counts, shuffle_buffer=500)
        loader = AsyncLoader(
            source,
            batch_size=BATCH,
            num_workers=2,
            fetch_in_workers=True,
            collate_fn=ImageBatch(args.size, output="uint8"),
            device=device,
            device_transform=Normalize(),
        )
        with loader:
            train(loader, args.steps, device, args.checkpoint)


if __name__ == "__main__":
    main()
