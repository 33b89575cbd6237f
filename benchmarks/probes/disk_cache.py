"""Disk cache: an epoch from a warm ``DiskCache`` against the same shards read from
local paths and against the uncached epoch over HTTP, on the JPEG-shards workload of
:mod:`benchmarks.probes.jpeg_shards` (40 tar shards of 100 JPEGs, one
:class:`examples.latency_server.LatencyServer` adding 20 ms to every request).

Pipelines, each one epoch of ``AsyncLoader(ShardedSource(...), batch_size=64, num_workers=2,
fetch_in_workers=True)`` in a fresh process:

- ``local``: ``ShardedSource(local shard paths)``, the shard files read in place;
- ``uncached``: ``ShardedSource(http urls)``;
- ``cold``: ``ShardedSource(http urls, cache=DiskCache(an empty directory))``: epoch 1,
  which fills the cache;
- ``warm``: the same over the directory the round's ``cold`` run filled: epoch 2.

Workloads: ``jpeg`` (jpeg_shards' ``ours/2``: decode, random-resized crop to 224, flip,
normalise; every image checked) and ``bytes`` (no decoding: each batch is its samples' keys,
checked exactly once; what is left is fetching, the cache and tar parsing). Rounds alternate
the four pipelines; ratios are taken per round (paired), then their median.

``python -m benchmarks.probes.disk_cache [--workload jpeg|bytes] [--reps 3] [--images 4000]``;
results in docs/sources.md ("Disk cache").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.probes.jpeg_shards import (
    BATCH,
    LATENCY_S,
    PER_SHARD,
    SHUFFLE,
    ImageChecker,
    KeyedImageBatch,
    expected_keys,
    shard_urls,
)

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ("local", "uncached", "cold", "warm")
RUN_TIMEOUT_S = 600


def keys_of(samples: Sequence[dict[str, Any]]) -> list[str]:
    """The ``bytes`` workload's collate: the batch's keys (its bytes read, never decoded)."""
    return [sample["__key__"] for sample in samples]


class KeyChecker:
    """Every expected key exactly once (the ``bytes`` workload's check)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.n = len(keys)
        self.expected = Counter(keys)
        self.seen: Counter[str] = Counter()

    def add(self, batch: list[str]) -> int:
        self.seen.update(batch)
        return len(batch)

    def verify(self) -> None:
        if self.seen != self.expected:
            raise AssertionError(f"{sum(self.seen.values())} keys for {self.n}, not each once")

    def summary(self) -> dict[str, Any]:
        return {"images": sum(self.seen.values())}


@contextlib.contextmanager
def pipeline(urls: Sequence[str], workload: str, cache_dir: str | None) -> Iterator[Any]:
    from asyncloader import AsyncLoader
    from asyncloader.sources import DiskCache, ShardedSource

    cache = None if cache_dir is None else DiskCache(cache_dir, max_bytes=1 << 40)
    collate = KeyedImageBatch() if workload == "jpeg" else keys_of
    loader = AsyncLoader(
        ShardedSource(list(urls), shuffle_buffer=SHUFFLE, cache=cache),
        batch_size=BATCH,
        num_workers=2,
        fetch_in_workers=True,
        collate_fn=collate,
    )
    with loader, contextlib.closing(iter(loader)) as it:
        yield it


def run_one(name: str, workload: str, images: int, port: int, cache_dir: str) -> dict[str, Any]:
    """One epoch of pipeline ``name``, checked; its timings."""
    from benchmarks.probes.jpeg_shards import _prepare
    from benchmarks.run_one import measure
    from examples.image_data import cached_shards

    _prepare()
    if name == "local":
        urls = [str(p) for p in cached_shards(images, PER_SHARD, seed=0)]
    else:
        urls = shard_urls(port, images)
    keys = expected_keys(images)
    checker = ImageChecker(keys) if workload == "jpeg" else KeyChecker(keys)
    cache = cache_dir if name in ("cold", "warm") else None
    timings = measure(pipeline(urls, workload, cache), checker)  # type: ignore[arg-type]
    return {"pipeline": name, **timings, "images_per_s": timings["items_per_s"]}


def in_fresh_process(*args: object) -> dict[str, Any]:
    from benchmarks.bench import run_sampled

    cmd = [sys.executable, "-m", "benchmarks.probes.disk_cache", *map(str, args)]
    result, _ = run_sampled(cmd, args, RUN_TIMEOUT_S, 0.05, ROOT)
    return result


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per pipeline, and the paired ratios of ``warm`` to ``local`` and ``uncached``."""
    out: dict[str, Any] = {
        name: {
            "images_per_s": statistics.median(r["images_per_s"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
            "cpu_ms_per_image": statistics.median(r["cpu_ms_per_item"] for r in rs),
        }
        for name, rs in runs.items()
    }
    for base in ("local", "uncached"):
        pairs = zip(runs["warm"], runs[base], strict=True)
        out[f"warm/{base}"] = statistics.median(
            a["images_per_s"] / b["images_per_s"] for a, b in pairs
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("jpeg", "bytes"), default="jpeg")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        from benchmarks.probes import disk_cache  # by name: what workers unpickle

        result = disk_cache.run_one(args.one, args.workload, args.images, args.port, args.cache)
        print(json.dumps(result))
        return
    from examples.image_data import cached_shards
    from examples.latency_server import LatencyServer

    bodies = [p.read_bytes() for p in cached_shards(args.images, PER_SHARD, seed=0)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PIPELINES}
    with LatencyServer(bodies, latency=LATENCY_S) as server:
        for rep in range(args.reps):
            cache = tempfile.mkdtemp(prefix="asyncloader-cache-")
            try:
                for name in PIPELINES:
                    result = in_fresh_process(
                        "--one", name, "--workload", args.workload, "--images", args.images,
                        "--port", server.port, "--cache", cache,
                    )  # fmt: skip
                    runs[name].append(result)
                    print(
                        f"  round {rep + 1}: {name:9s} {result['images_per_s']:7.0f} images/s",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    summary = summarise(runs)
    print(
        f"{args.images} images, {args.workload}, {os.cpu_count()} cores, {args.reps} rounds "
        f"(+{LATENCY_S * 1e3:.0f} ms/request)"
    )
    for name in PIPELINES:
        m = summary[name]
        print(
            f"| {name} | {m['images_per_s']:.0f} images/s | {m['wall_s']:.2f} s | "
            f"{m['cpu_ms_per_image']:.2f} CPU ms/image |"
        )
    for key in ("warm/local", "warm/uncached"):
        print(f"{key}: {summary[key]:.2f}x")


if __name__ == "__main__":
    main()
