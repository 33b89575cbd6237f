"""Pretrain a tiny byte-level language model on a weighted mix of two shard sets over HTTP.

Writes two sets of WebDataset tar shards of text once under ``.cache/mix_shards`` (``web``:
sentences; ``code``: Python-like functions), serves them from a local HTTP server (its own
process, 127.0.0.1, a free port) that waits 5 ms before each response, and trains a small
MLP that predicts each byte from the 8 before it, on::

    cache = DiskCache(directory, max_bytes=64 << 20)      # a temporary one, or --cache DIR
    mix = Mix(
        {"web": ShardedSource(web_urls, samples_per_shard=..., cache=cache),
         "code": ShardedSource(code_urls, samples_per_shard=..., cache=cache)},
        {"web": 0.7, "code": 0.3},
        stop="never", samples_per_epoch=steps * BATCH,   # a source that runs out restarts
    )
    AsyncLoader(mix, batch_size=BATCH, num_workers=2, transform=to_bytes, distributed=True)

``distributed=True`` (one rank here) tells the Mix each epoch. Each source holds fewer
samples than its share of an epoch, so the first epoch downloads every shard into the cache
and the next ones read them all from it (``0 misses``). After each epoch it prints the
samples the model received of each source (``loader.stats.sources``, exact, although the
loader runs ahead of the model) and what the cache did, and at the end ``cache.report()``.
``--checkpoint PATH`` saves model and loader after each epoch (and at ``--stop-at``); run
again with the same path to resume from there, the mix where it stopped (the server's port,
so the URLs and the cache's entries, are new each run).

``python examples/pretrain_mix.py [--steps 30] [--epochs 2] [--workers 2] [--stop-at STEP]
[--checkpoint PATH] [--cache DIR]``
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tarfile
import tempfile
from pathlib import Path

import torch
from latency_server import LatencyServer
from torch import nn

from asyncloader import AsyncLoader
from asyncloader.sources import DiskCache, Mix, ShardedSource

CONTEXT, LENGTH, BATCH, LATENCY_S = 8, 64, 16, 0.005
WEIGHTS = {"web": 0.7, "code": 0.3}
#: (shards, samples per shard) of each set: both smaller than their share of an epoch of
#: 10 steps (160 draws), so that every shard is read in the first epoch.
SHARDS = {"web": (4, 16), "code": (2, 12)}
WORDS = [
    "the", "a", "of", "to", "and", "in", "is", "it", "that", "for", "on", "with", "as", "by",
    "at", "from", "this", "are", "data", "model", "loader", "shard", "cache", "weight",
    "batch", "epoch", "sample", "step", "mix", "source", "stream", "byte", "token", "train",
]  # fmt: skip


def web_text(rng: random.Random) -> str:
    """Two or three sentences of random words."""
    sentences = (" ".join(rng.choices(WORDS, k=rng.randint(5, 10))) for _ in range(3))
    return " ".join(s.capitalize() + "." for s in sentences)


def code_text(rng: random.Random) -> str:
    """A small Python function."""
    name, op, k = rng.choice(WORDS), rng.choice("+-*"), rng.randint(1, 9)
    return f"def {name}_{k}(x):\n    return x {op} {k}\n"


def tar_shard(texts: list[tuple[str, str]]) -> bytes:
    """A WebDataset tar shard: ``{key}.txt`` per sample, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, text in texts:
            data = text.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def cached_shards(name: str, directory: str = ".cache/mix_shards") -> list[Path]:
    """The shards of set ``name``, written once under ``directory`` and reused."""
    count, per = SHARDS[name]
    where = Path(directory) / f"{name}-{count}x{per}"
    paths = [where / f"shard-{i:04d}.tar" for i in range(count)]
    if not all(p.exists() for p in paths):
        where.mkdir(parents=True, exist_ok=True)
        make, rng = web_text if name == "web" else code_text, random.Random(name)
        for i, path in enumerate(paths):
            texts = [(f"{name}-{i:04d}-{j:04d}", make(rng)) for j in range(per)]
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(tar_shard(texts))
            tmp.replace(path)
    return paths


def to_bytes(sample: dict) -> torch.Tensor:
    """A sample's text as ``LENGTH`` bytes (cut, or padded with spaces); in the workers."""
    text = sample["txt"][:LENGTH].ljust(LENGTH, b" ")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


class ByteMLP(nn.Module):
    """The next byte from the ``CONTEXT`` bytes before it."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, 16)
        self.mlp = nn.Sequential(
            nn.Flatten(), nn.Linear(CONTEXT * 16, width), nn.ReLU(), nn.Linear(width, 256)
        )

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(context))


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every byte of ``batch`` after its first ``CONTEXT``."""
    windows = batch.long().unfold(1, CONTEXT + 1, 1).reshape(-1, CONTEXT + 1)
    return nn.functional.cross_entropy(model(windows[:, :-1]), windows[:, -1])


def build(server: LatencyServer, cache: DiskCache, steps: int, workers: int) -> AsyncLoader:
    urls, sources = server.urls(), {}
    for name in ("web", "code"):  # the server's bodies: web's shards, then code's
        count, per = SHARDS[name]
        mine, urls = urls[:count], urls[count:]
        sources[name] = ShardedSource(mine, samples_per_shard=per, shuffle_buffer=32, cache=cache)
    mix = Mix(sources, WEIGHTS, stop="never", samples_per_epoch=steps * BATCH)
    return AsyncLoader(
        mix, batch_size=BATCH, num_workers=workers, transform=to_bytes, distributed=True
    )


def sgd_step(model: nn.Module, loss: torch.Tensor, lr: float = 0.5) -> None:
    """Plain SGD, by hand: ``torch.optim``'s first use imports ``torch._dynamo``, seconds of
    start-up for a demo that trains for a few."""
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def report_epoch(epoch: int, loader: AsyncLoader, losses: list[float], cached: tuple) -> None:
    """The epoch's samples of each source (those the model received), its mean loss, and
    ``cached``: the cache's ``(hits, misses)`` during it."""
    stats = loader.stats
    counts = ", ".join(f"{name} {n}" for name, n in stats.sources.items())
    print(
        f"epoch {epoch}: {stats.samples} samples ({counts}); loss {sum(losses) / len(losses):.2f}"
        f"; cache: {cached[0]} hits, {cached[1]} misses"
    )


def train(loader: AsyncLoader, cache: DiskCache, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = ByteMLP()
    step, checkpoint = 0, args.checkpoint
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=True)  # plain data: no pickled code
        model.load_state_dict(state["model"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step} from {checkpoint}")

    def save() -> None:
        if checkpoint:
            state = {"model": model.state_dict(), "loader": loader.state_dict(), "step": step}
            torch.save(state, checkpoint)
            print(f"saved model and loader at step {step} to {checkpoint}")

    while step < args.epochs * args.steps:
        before, losses = cache.stats, []
        for batch in loader:
            loss = loss_of(model, batch)
            sgd_step(model, loss)
            step += 1
            losses.append(loss.item())
            if step == args.stop_at:
                save()
                return
        if losses:  # not the rest of an epoch that a checkpoint at its last step ended
            after = cache.stats
            cached = (after.hits - before.hits, after.misses - before.misses)
            report_epoch(-(-step // args.steps), loader, losses, cached)
            save()
    print(cache.report())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stop-at", type=int, default=None, help="stop (and save) there")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--cache", default=None, help="the cache's directory (default: temporary)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the workers have the other cores
    shards = [p.read_bytes() for name in ("web", "code") for p in cached_shards(name)]
    with (
        tempfile.TemporaryDirectory() as scratch,
        LatencyServer(shards, latency=LATENCY_S) as server,
    ):
        cache = DiskCache(args.cache or scratch, max_bytes=64 << 20)
        with build(server, cache, args.steps, args.workers) as loader:
            train(loader, cache, args)


if __name__ == "__main__":
    main()
