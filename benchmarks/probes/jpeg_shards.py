"""Real image training input: JPEG tar shards over HTTP, webdataset + DataLoader against
asyncloader (and NVIDIA DALI's CPU pipeline where it is installed), side by side.

Workload: 4,000 JPEGs (about 70 KB, 320-500 x 240-375 px, :mod:`examples.image_data`) in 40
WebDataset tar shards of 100 (``{key}.jpg``, ``{key}.cls``), served by one
:class:`examples.latency_server.LatencyServer` (its own process, 127.0.0.1, 20 ms added to every
request) that runs for the whole comparison. Every image is decoded from its bytes, cropped
with torchvision's ``RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))`` rule, flipped
with p=0.5, made ``float32`` CHW and ImageNet-normalised; batches of 64; a shuffle buffer
of 1000 samples (first sample out at 100) everywhere. Pipelines:

- ``wds+DataLoader/N``, the reference: ``wds.WebDataset(urls, shardshuffle=100)`` (its default
  splitters: each of the N workers reads its share of the shards) ``.shuffle(1000)
  .map(transform).batched(64)`` in ``DataLoader(batch_size=None, num_workers=N)``, batching in
  the workers as webdataset's README and examples do. ``transform`` is
  :func:`reference_transform`: what torchvision's transforms do, in Pillow + numpy as a careful
  user writes it (one ``Image.resize`` of the box, one normalisation pass), without
  torchvision;
- ``wds+DataLoader(batch_size=64)/2``: the same, batched by DataLoader (``batch_size=64``)
  instead of ``.batched(64)``: ``default_collate`` stacks into shared memory directly, where
  webdataset's collation stacks into private memory that the worker's queue then copies into
  shared memory (about 0.35 CPU ms per image here), so this variant is the stronger reference;
- ``ours/N``: ``ShardedSource(urls, shuffle_buffer=1000)`` in ``AsyncLoader(batch_size=64,
  num_workers=N, fetch_in_workers=True, collate_fn=ImageBatch(224))``: only the crop of each
  JPEG decoded when the ``turbojpeg`` wheel is installed;
- ``ours/2 pillow``: the same with ``ImageBatch(224, decoder="pillow")`` (Pillow's full
  decode);
- ``ours/2 uint8+draft`` and ``ours/2 uint8``: ``ImageBatch(224, output="uint8", draft=...)``
  with ``device_transform=Normalize()`` (the normalisation on the loader's device stage, here on
  the CPU, so it is inside the measurement);
- ``wds-object/2``: the reference's webdataset pipeline object (before ``.batched``) given as
  it is to ``AsyncLoader(batch_size=64, num_workers=2, fetch_in_workers=True)``;
- ``dali-cpu/2`` (only where ``nvidia.dali`` imports, e.g. ``pip install nvidia-dali-cuda120``;
  no GPU needed): DALI's CPU pipeline, the anchor: :func:`dali_cpu`;
- ``decode alone``: no loader, one process, one torch thread: :func:`reference_transform` and
  :func:`weak_reference_transform` (the reference before: more passes) over every image, and
  ``ImageBatch`` (region decode, or ``decoder="pillow"``) over lists of 64 samples, read from
  the local shard files
  (parsed before the clock). Its CPU per image is the floor a loader's CPU per image is
  compared with.

Every pipeline also returns each sample's key, and every run is checked (:class:`ImageChecker`):
each of the 4,000 keys exactly once, its label, the batch's shape and dtype (``float32``, after
``Normalize`` where it applies), values in the normalised range. A run that fails the check is
an error, not a number. Each run is a fresh process (:func:`benchmarks.side_by_side
.in_fresh_process`'s way, with the tree's RSS sampled from this process as
:mod:`benchmarks.bench` does); pipelines alternate in rounds; ratios to the reference are taken
per round (paired), then their median. Timed as :func:`benchmarks.run_one.measure` times: the
clock starts just before the loader is built and stops at its last batch; CPU is that of the
whole process tree.

``python -m benchmarks.probes.jpeg_shards [--reps 3] [--images 4000] [--only NAME ...]
[--save [SECTION]] [--plot PATH] [--toy]``; ``--replot [SECTION] [--plot PATH]`` prints the
table of a saved summary again and plots it (matplotlib, from the ``bench`` extra). ``--toy``:
one round of 200 images (2 shards), to check that every pipeline still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import itertools
import json
import os
import platform
import random
import resource
import sys
import tarfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import side_by_side

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.probes.jpeg_shards"
SECTION = "jpeg_shards"  # of benchmarks/results/summary.json's probes
SIZE = 224
BATCH = 64
PER_SHARD = 100
LATENCY_S = 0.020
SHUFFLE = 1000
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
CLASSES = 10  # examples.image_data labels sample i with i % 10
MEAN = np.array((0.485, 0.456, 0.406), dtype=np.float32)
STD = np.array((0.229, 0.224, 0.225), dtype=np.float32)
REFERENCE = "wds+DataLoader/2"
ALT_REFERENCE = "wds+DataLoader(batch_size=64)/2"  # the same, batched by DataLoader instead
DALI = "dali-cpu/2"
INITIAL = 100  # webdataset's shuffle: samples in the buffer before the first comes out
RUN_TIMEOUT_S = 600
SAMPLE_EVERY_S = 0.02

# ---------------------------------------------------------------------------------------------
# The reference transform: torchvision's RandomResizedCrop + RandomHorizontalFlip + ToTensor +
# Normalize, in Pillow and numpy, as a careful user writes it.

GAIN = (1 / (255 * STD)).astype(np.float32)[:, None, None]  # float = pixel * GAIN + BIAS
BIAS = (-MEAN / STD).astype(np.float32)[:, None, None]


def reference_pixels(jpeg: bytes) -> np.ndarray:
    """Pillow's decode, ``RandomResizedCrop(224)``'s box (torchvision's rule, the one
    :func:`asyncloader.images.random_resized_box` implements) resized by one
    ``Image.resize((224, 224), BILINEAR, box=box)``, the flip (p=0.5) as a reversed view, and one
    normalisation (``pixel * gain + bias``, ``gain = 1 / (255 std)``, ``bias = -mean / std``)
    that writes ``float32`` CHW: torchvision's usual training transform, in Pillow + numpy,
    with no pass it does not need."""
    from PIL import Image

    from asyncloader.images import random_resized_box

    image = Image.open(io.BytesIO(jpeg))
    if image.mode != "RGB":
        image = image.convert("RGB")
    box = random_resized_box(*image.size, SCALE, RATIO)
    x = np.asarray(image.resize((SIZE, SIZE), Image.BILINEAR, box=box)).transpose(2, 0, 1)
    if random.random() < 0.5:
        x = x[:, :, ::-1]
    out = np.empty((3, SIZE, SIZE), dtype=np.float32)
    np.multiply(x, GAIN, out=out, casting="unsafe")
    out += BIAS
    return out


def weak_reference_pixels(jpeg: bytes) -> np.ndarray:
    """The weak reference (this probe's reference before the strong one): the same transform
    with more passes: ``convert("RGB")`` always (a copy), the flip by Pillow (a copy),
    ``float32``, ``/ 255``, ``- mean``, ``/ std`` each a pass, then a CHW copy."""
    from PIL import Image

    from asyncloader.images import random_resized_box

    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    box = random_resized_box(*image.size, SCALE, RATIO)
    image = image.resize((SIZE, SIZE), Image.BILINEAR, box=box)
    if random.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    x = np.asarray(image, dtype=np.float32)
    x /= 255.0
    x -= MEAN
    x /= STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def weak_reference_transform(sample: dict[str, Any]) -> tuple[Any, int]:
    """:func:`reference_transform` with :func:`weak_reference_pixels`."""
    import torch

    return torch.from_numpy(weak_reference_pixels(sample["jpg"])), int(sample["cls"])


def reference_transform(sample: dict[str, Any]) -> tuple[Any, int]:
    """One webdataset sample (``{"__key__", "jpg": bytes, "cls": b"3"}``) -> ``(float32
    [3, 224, 224] normalised, label)``: :func:`reference_pixels` as a tensor."""
    import torch

    return torch.from_numpy(reference_pixels(sample["jpg"])), int(sample["cls"])


def keyed_transform(sample: dict[str, Any]) -> tuple[Any, int, str]:
    """:func:`reference_transform` with the sample's key added, for the exactly-once check."""
    image, label = reference_transform(sample)
    return image, label, sample["__key__"]


class KeyedImageBatch:
    """``ImageBatch(224, **options)`` as a ``collate_fn`` that also returns the samples' keys:
    ``(images, labels, keys)`` (a top-level class: it goes to the workers by pickle)."""

    def __init__(self, **options: Any) -> None:
        from asyncloader.images import ImageBatch

        self.batch = ImageBatch(SIZE, **options)

    def __call__(self, samples: Sequence[dict[str, Any]]) -> tuple[Any, Any, list[str]]:
        images, labels = self.batch(samples)
        return images, labels, [s["__key__"] for s in samples]


# ---------------------------------------------------------------------------------------------
# The check.


class DeliveryError(AssertionError):
    """A run delivered the wrong images: missing, repeated, foreign, mislabelled or malformed."""


# The normalised range: (0 - mean) / std .. (1 - mean) / std, with a margin for rounding.
_LOW = float(((0 - MEAN) / STD).min()) - 0.01
_HIGH = float(((1 - MEAN) / STD).max()) + 0.01


class ImageChecker:
    """Accumulates ``(images, labels, keys)`` batches; :meth:`verify` fails unless every
    expected key came exactly once. Each batch: ``float32 [B, 3, 224, 224]`` images whose values
    (a strided sample of them) lie in the normalised range, ``B`` labels equal to the key's
    ``int(key) % 10``, ``B`` keys. Same interface as :class:`benchmarks.checks.Checker`
    (``n``, ``add``, ``verify``, ``summary``), so :func:`benchmarks.run_one.measure` takes it."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.n = len(keys)
        self.expected = Counter(keys)
        self.seen: Counter[str] = Counter()
        self.batches = 0
        self.sizes: Counter[int] = Counter()

    def add(self, batch: Any) -> int:
        import torch

        try:
            images, labels, keys = batch
        except (TypeError, ValueError):
            raise DeliveryError(
                f"a batch must be (images, labels, keys), got {type(batch)}"
            ) from None
        keys = list(keys)
        b = len(keys)
        if not isinstance(images, torch.Tensor):
            raise DeliveryError(f"images must be a tensor, got {type(images).__qualname__}")
        if images.dtype != torch.float32 or tuple(images.shape) != (b, 3, SIZE, SIZE):
            raise DeliveryError(f"images {images.dtype} {tuple(images.shape)} for {b} keys")
        # numpy, not torch: torch's reductions would start OpenMP threads in the training
        # process, whose spin-waiting takes CPU from the loader being measured.
        spot = images.numpy()[:, :, ::13, ::13]
        low, high = float(spot.min()), float(spot.max())
        if not (low >= _LOW and high <= _HIGH):  # also false for NaN
            raise DeliveryError(f"image values {low:.3f}..{high:.3f} outside the normalised range")
        got = [int(x) for x in np.asarray(labels).reshape(-1)]
        want = [int(k) % CLASSES for k in keys]
        if got != want:
            raise DeliveryError(f"labels {got[:8]}... do not match keys {keys[:8]}...")
        self.seen.update(keys)
        self.batches += 1
        self.sizes[b] += 1
        return b

    def verify(self) -> None:
        if self.seen == self.expected:
            return
        missing = self.expected - self.seen
        extra = self.seen - self.expected
        raise DeliveryError(
            f"{sum(self.seen.values())} images for {self.n} expected: "
            f"{sum(missing.values())} missing (e.g. {sorted(missing)[:5]}), "
            f"{sum(extra.values())} repeated or foreign (e.g. {sorted(extra)[:5]})"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "images": sum(self.seen.values()),
            "batches": self.batches,
            "batch_sizes": {str(k): v for k, v in sorted(self.sizes.items())},
        }


def expected_keys(images: int) -> list[str]:
    """The keys :func:`examples.image_data.make_images` gives ``images`` samples."""
    return [f"{i:06d}" for i in range(images)]


# ---------------------------------------------------------------------------------------------
# The pipelines: each a context manager over ``urls`` that builds its loader when entered (the
# clock is already running) and yields an iterable of ``(images, labels, keys)`` batches.


def wds_dataset(urls: Sequence[str]) -> Any:
    """The reference's webdataset pipeline, before batching: per-sample
    ``(image, label, key)``. Default node and worker splitters: each worker reads its share of
    the shards; shard order shuffled (buffer 100 > 40 shards), samples shuffled in 1000
    (webdataset's ``initial`` is 100)."""
    import webdataset as wds

    return (
        wds.WebDataset(list(urls), shardshuffle=100, seed=0).shuffle(SHUFFLE).map(keyed_transform)
    )


@contextlib.contextmanager
def wds_dataloader(urls: Sequence[str], workers: int, wds_batched: bool = True) -> Iterator[Any]:
    """webdataset + DataLoader, batched in the workers: by webdataset (``.batched(64)``,
    ``batch_size=None``, as its README and examples do), or by DataLoader (``batch_size=64``:
    ``default_collate`` stacks straight into shared memory, where webdataset's collation
    stacks into private memory that the worker's queue then copies to shared memory)."""
    from torch.utils.data import DataLoader

    from benchmarks.loaders import iterating

    if wds_batched:
        loader = DataLoader(wds_dataset(urls).batched(BATCH), batch_size=None, num_workers=workers)
    else:
        loader = DataLoader(wds_dataset(urls), batch_size=BATCH, num_workers=workers)
    with iterating(loader) as it:
        yield it


@contextlib.contextmanager
def ours(
    urls: Sequence[str],
    workers: int,
    output: str = "float32",
    draft: bool = False,
    decoder: str = "auto",
    **options: Any,
) -> Iterator[Any]:
    """ShardedSource + AsyncLoader + ImageBatch; with ``output="uint8"``, ``Normalize()`` on
    the device stage; ``decoder="pillow"``: Pillow's full decode instead of the region's."""
    from asyncloader import AsyncLoader
    from asyncloader.sources import ShardedSource

    if output == "uint8":
        from asyncloader.images import Normalize

        options["device_transform"] = Normalize()
    loader = AsyncLoader(
        ShardedSource(list(urls), shuffle_buffer=SHUFFLE),
        batch_size=BATCH,
        num_workers=workers,
        fetch_in_workers=True,
        collate_fn=KeyedImageBatch(output=output, draft=draft, decoder=decoder),
        **options,
    )
    with loader, contextlib.closing(iter(loader)) as it:
        yield it


@contextlib.contextmanager
def wds_object(urls: Sequence[str], workers: int) -> Iterator[Any]:
    """The reference's webdataset pipeline object, unchanged, in AsyncLoader."""
    from asyncloader import AsyncLoader

    loader = AsyncLoader(
        wds_dataset(urls), batch_size=BATCH, num_workers=workers, fetch_in_workers=True
    )
    with loader, contextlib.closing(iter(loader)) as it:
        yield it


def shuffled_samples(urls: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The shards' samples read over HTTP (one request per shard, shards in a seeded random
    order), shuffled as webdataset's ``.shuffle(1000)`` does (its buffer and ``initial=100``)."""
    import urllib.request

    rng = random.Random(0)
    order = list(urls)
    rng.shuffle(order)

    def samples() -> Iterator[dict[str, Any]]:
        for url in order:
            with urllib.request.urlopen(url) as response:
                body = response.read()
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                yield from tar_samples(tar, url)

    buffer: list[dict[str, Any]] = []
    source = samples()
    for sample in source:
        buffer.append(sample)
        if len(buffer) < SHUFFLE:
            buffer.extend(itertools.islice(source, 1))
        if len(buffer) >= INITIAL:
            yield buffer.pop(rng.randrange(len(buffer)))
    rng.shuffle(buffer)
    yield from buffer


@contextlib.contextmanager
def dali_cpu(urls: Sequence[str], threads: int = 2) -> Iterator[Any]:
    """NVIDIA DALI's CPU pipeline (``device_id=None``: no GPU), the anchor: the samples of
    :func:`shuffled_samples` by ``fn.external_source`` (in DALI's prefetching), then
    ``fn.decoders.image_random_crop(device="cpu")`` (the crop box chosen from the header,
    only the crop decoded: libjpeg-turbo's cropped decode), ``fn.resize`` to 224 (linear,
    antialiased), ``fn.crop_mirror_normalize`` (flip p=0.5, ``float32`` CHW, ImageNet
    normalisation); batches of 64 on a pool of ``threads`` threads, in this process."""
    import torch
    from nvidia.dali import fn, pipeline_def, types

    samples = shuffled_samples(urls)

    def source() -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        batch = list(itertools.islice(samples, BATCH))
        if not batch:
            raise StopIteration  # ends DALI's epoch
        return (
            [np.frombuffer(s["jpg"], dtype=np.uint8) for s in batch],
            [np.array(int(s["cls"]), dtype=np.int64) for s in batch],
            [np.array(int(s["__key__"]), dtype=np.int64) for s in batch],
        )

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0)
    def pipeline() -> Any:
        jpegs, labels, keys = fn.external_source(source=source, num_outputs=3, batch=True)
        images = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=SCALE,
            random_aspect_ratio=RATIO,
            num_attempts=10,
        )
        images = fn.resize(
            images, resize_x=SIZE, resize_y=SIZE, interp_type=types.INTERP_LINEAR, antialias=True
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=(MEAN * 255).tolist(),
            std=(STD * 255).tolist(),
            mirror=fn.random.coin_flip(probability=0.5),
        )
        return images, labels, keys

    pipe = pipeline()
    pipe.build()

    def run() -> Iterator[tuple[Any, np.ndarray, list[str]]]:
        while True:
            try:
                images, labels, keys = pipe.run()
            except StopIteration:
                return
            names = [f"{int(k):06d}" for k in keys.as_array()]
            yield torch.from_numpy(images.as_array()), labels.as_array(), names

    yield run()


def _has_dali() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ImportError:
        return False


PIPELINES: dict[str, Callable[[Sequence[str]], contextlib.AbstractContextManager[Any]]] = {
    "wds+DataLoader/2": lambda urls: wds_dataloader(urls, 2),
    ALT_REFERENCE: lambda urls: wds_dataloader(urls, 2, wds_batched=False),
    "ours/2": lambda urls: ours(urls, 2),
    "ours/2 pillow": lambda urls: ours(urls, 2, decoder="pillow"),
    "ours/2 uint8+draft": lambda urls: ours(urls, 2, output="uint8", draft=True),
    "ours/2 uint8": lambda urls: ours(urls, 2, output="uint8"),
    "wds-object/2": lambda urls: wds_object(urls, 2),
    "wds+DataLoader/1": lambda urls: wds_dataloader(urls, 1),
    "ours/1": lambda urls: ours(urls, 1),
}
if _has_dali():  # nvidia-dali (e.g. nvidia-dali-cuda120): the anchor, where it is installed
    PIPELINES[DALI] = lambda urls: dali_cpu(urls, 2)
ALONE = "decode alone"
# The reference each pipeline's ratio is taken to (same round).
BASELINES = {name: "wds+DataLoader/1" if name.endswith("/1") else REFERENCE for name in PIPELINES}


# ---------------------------------------------------------------------------------------------
# One run, in this (fresh) process.


def _prepare() -> None:
    """Before the clock: every library any pipeline uses imported, the heap collected."""
    warnings.filterwarnings("ignore", module="webdataset")
    import PIL.Image  # noqa: F401
    import torch  # noqa: F401
    import webdataset  # noqa: F401

    import asyncloader
    import asyncloader.images
    import asyncloader.sources  # noqa: F401

    gc.collect()


def shard_urls(port: int, images: int) -> list[str]:
    return [f"http://127.0.0.1:{port}/{i}" for i in range(-(-images // PER_SHARD))]


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_pipeline(name: str, port: int, images: int) -> dict[str, Any]:
    """One epoch of pipeline ``name`` over the server's shards, checked; its timings."""
    from benchmarks.run_one import measure

    _prepare()
    if name == DALI:
        import nvidia.dali.fn  # noqa: F401
    checker = ImageChecker(expected_keys(images))
    self0 = _self_cpu()
    timings = measure(PIPELINES[name](shard_urls(port, images)), checker)
    main_cpu = _self_cpu() - self0
    return {
        "pipeline": name,
        "images": images,
        **timings,
        "images_per_s": timings["items_per_s"],
        "cpu_ms_per_image": timings["cpu_ms_per_item"],
        "main_cpu_ms_per_image": main_cpu * 1e3 / images,
        "self_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "check": {"ok": True, **checker.summary()},
    }


def tar_samples(tar: tarfile.TarFile, url: str) -> Iterator[dict[str, Any]]:
    """The samples of one tar shard, as webdataset and ShardedSource give them."""
    current: dict[str, Any] = {}
    for member in tar:
        key, _, ext = member.name.partition(".")
        if current.get("__key__") != key:
            if current:
                yield current
            current = {"__key__": key, "__url__": url}
        current[ext] = tar.extractfile(member).read()
    if current:
        yield current


def read_samples(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The samples of local tar shards, as webdataset and ShardedSource give them."""
    samples: list[dict[str, Any]] = []
    for path in paths:
        with tarfile.open(path) as tar:
            samples.extend(tar_samples(tar, str(path)))
    return samples


#: The cases of "decode alone": a transform of :data:`ALONE_TRANSFORMS` (``None``), or the
#: options of a :class:`KeyedImageBatch`.
ALONE_CASES: dict[str, dict[str, Any] | None] = {
    "alone: reference_transform": None,
    "alone: weak reference_transform": None,
    "alone: ImageBatch": {},
    "alone: ImageBatch pillow": {"decoder": "pillow"},
    "alone: ImageBatch uint8+draft": {"output": "uint8", "draft": True},
    "alone: ImageBatch uint8": {"output": "uint8"},
}


ALONE_TRANSFORMS = {
    "alone: reference_transform": reference_transform,
    "alone: weak reference_transform": weak_reference_transform,
}


def run_alone(images: int) -> dict[str, Any]:
    """Decode + transform with no loader: one process, one torch thread, samples in memory.
    CPU per image of this process; the ``uint8`` cases include ``Normalize`` on each batch."""
    import torch

    from examples.image_data import cached_shards

    _prepare()
    torch.set_num_threads(1)
    samples = read_samples(cached_shards(images, PER_SHARD, seed=0))
    keys = expected_keys(images)
    out: dict[str, Any] = {"pipeline": ALONE, "images": images, "cases": {}}
    for case, options in ALONE_CASES.items():
        checker = ImageChecker(keys)
        gc.collect()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if options is None:
            transform = ALONE_TRANSFORMS[case]
            for s in samples:
                image, label = transform(s)
                checker.add((image[None], [label], [s["__key__"]]))
        else:
            from asyncloader.images import Normalize

            collate, normalize = KeyedImageBatch(**options), Normalize()
            for i in range(0, len(samples), BATCH):
                checker.add(normalize(collate(samples[i : i + BATCH])))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        checker.verify()
        out["cases"][case] = {
            "images_per_s": images / wall,
            "cpu_ms_per_image": cpu * 1e3 / images,
        }
    return out


# ---------------------------------------------------------------------------------------------
# The driver.


def in_fresh_process(*args: object) -> dict[str, Any]:
    """``python -m benchmarks.probes.jpeg_shards args...`` in a fresh process, its tree's RSS
    sampled from here every 20 ms (as :mod:`benchmarks.bench` samples its runs); its JSON
    result, with ``peak_rss_mb`` (shared memory counted in every process that maps it)."""
    return side_by_side.in_fresh_process_sampled(
        MODULE, *args, every_s=SAMPLE_EVERY_S, timeout_s=RUN_TIMEOUT_S, rss=True
    )


KEYS = (
    "images_per_s",
    "ttfb_s",
    "cpu_ms_per_image",
    "main_cpu_ms_per_image",
    "peak_rss_mb",
    "wall_s",
)


def _ratios(name: str, runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Pipeline ``name``'s paired ratios (the median over rounds of its ratio to the same
    round's other pipeline): to its baseline (images/s, first batch), and to the
    DataLoader-batched reference and DALI's pipeline where they ran."""
    base, out = BASELINES.get(name, REFERENCE), {}

    def to(other: str, key: str = "images_per_s") -> float:
        return side_by_side.paired({name: runs[name], other: runs[other]}, other, key)[name][1]

    if base in runs and name != base:
        out |= {"baseline": base, "ratio": to(base), "ttfb_ratio": to(base, "ttfb_s")}
    for other, key in ((ALT_REFERENCE, "ratio_to_alt"), (DALI, "ratio_to_dali")):
        if other in runs and name not in (other, REFERENCE) and base == REFERENCE:
            out[key] = to(other)
    return out


def summarise(runs: dict[str, list[dict]], alone: list[dict]) -> dict[str, Any]:
    """Medians per pipeline, paired ratios (per round, then the median), the targets."""
    medians: dict[str, dict[str, Any]] = side_by_side.medians(runs, KEYS)
    for name, rs in runs.items():
        medians[name]["images_per_s_min"] = min(r["images_per_s"] for r in rs)
        medians[name]["images_per_s_max"] = max(r["images_per_s"] for r in rs)
        medians[name] |= _ratios(name, runs) | {"runs": len(rs)}
    if alone:
        cases = {case: [a["cases"][case] for a in alone] for case in ALONE_CASES}
        for case, m in side_by_side.medians(cases, ("images_per_s", "cpu_ms_per_image")).items():
            medians[case] = m | {"runs": len(alone)}
    return {"medians": medians, "targets": targets(medians)}


#: The issue's targets on ratios: (pipeline, its ratio's key, what, at least / at most, goal).
RATIO_TARGETS = (
    ("ours/2", "ratio", f"ours/2 vs {REFERENCE}, images/s", ">=", 2.0),
    ("ours/2", "ratio_to_alt", f"ours/2 vs {ALT_REFERENCE}, images/s", ">=", 2.0),
    ("ours/2", "ratio_to_dali", f"ours/2 vs {DALI}, images/s", ">=", 1.0),
    ("ours/2 uint8+draft", "ratio", f"ours/2 uint8+draft vs {REFERENCE}, images/s", ">=", 1.5),
    ("ours/2", "ttfb_ratio", f"ours/2 first batch / {REFERENCE}'s", "<=", 1.0),
    ("wds-object/2", "ratio", f"wds-object/2 vs {REFERENCE}, images/s", ">=", 1.0),
)
#: The targets on CPU per image: (pipeline, what it is compared with); at most +15%.
CPU_TARGETS = (
    ("ours/2", "alone: ImageBatch"),
    ("ours/2 uint8+draft", "alone: ImageBatch uint8+draft"),
    ("ours/2", "alone: reference_transform"),
)


def targets(m: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with what was measured and whether it was met."""
    out: list[dict[str, Any]] = []
    for name, key, what, op, goal in RATIO_TARGETS:
        if key in m.get(name, {}):
            r = m[name][key]
            met = r >= goal if op == ">=" else r <= goal
            out.append({"target": what, "measured": r, "goal": f"{op} {goal}x", "met": met})
    for name, alone in CPU_TARGETS:
        if name in m and alone in m:
            excess = m[name]["cpu_ms_per_image"] / m[alone]["cpu_ms_per_image"] - 1
            what = f"{name} CPU/image over {alone}"
            out.append(
                {"target": what, "measured": excess, "goal": "<= +15%", "met": excess <= 0.15}
            )
    return out


def table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    """The markdown table of the medians, and the targets."""
    lines = [
        f"{args.images} JPEGs in {-(-args.images // PER_SHARD)} shards over HTTP "
        f"(+{LATENCY_S * 1e3:.0f} ms/request), batches of {BATCH}, {args.reps} fresh processes "
        "each, pipelines alternating; medians (ratio: per round, to the same round's reference, "
        "then the median)",
        "",
        "| pipeline | images/s | ratio | first batch s | CPU ms/image | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in summary["medians"].items():
        if name.startswith("alone:"):
            lines.append(
                f"| {name} | {m['images_per_s']:.0f} | | | {m['cpu_ms_per_image']:.2f} | |"
            )
            continue
        ratio = (
            f"{m['ratio']:.2f}x"
            if "ratio" in m
            else "1.00x (ref)"
            if name in (REFERENCE, "wds+DataLoader/1")
            else ""
        )
        lines.append(
            f"| {name} | {m['images_per_s']:.0f} | {ratio} | {m['ttfb_s']:.2f} | "
            f"{m['cpu_ms_per_image']:.2f} | {m['peak_rss_mb']:.0f} |"
        )
    if summary["targets"]:
        lines += ["", "| target | measured | goal | met |", "|---|---:|---|---|"]
        for t in summary["targets"]:
            value = t["measured"]
            shown = f"{value:+.0%}" if "%" in t["goal"] else f"{value:.2f}x"
            lines.append(
                f"| {t['target']} | {shown} | {t['goal']} | {'met' if t['met'] else 'not met'} |"
            )
    return "\n".join(lines)


def _color(name: str) -> str:
    """The bar colour of a pipeline: the references red, wds-object orange, DALI green, ours
    purple."""
    if name.startswith("wds+DataLoader"):
        return "#d62728"
    if name.startswith("wds-object"):
        return "#ff7f0e"
    return "#76b900" if name == DALI else "#9467bd"


def plot(summary: dict[str, Any], path: str) -> None:
    """Images/s (median, min-max over rounds) and CPU ms per image, per pipeline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = summary["medians"]
    loaders = [n for n in m if not n.startswith("alone:")]
    colors = [_color(n) for n in loaders]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    y = [m[n]["images_per_s"] for n in loaders]
    err = [
        [v - m[n]["images_per_s_min"] for v, n in zip(y, loaders, strict=True)],
        [m[n]["images_per_s_max"] - v for v, n in zip(y, loaders, strict=True)],
    ]
    ax1.bar(range(len(loaders)), y, color=colors, yerr=err, capsize=3)
    ax1.set_ylim(0, 1.15 * max(m[n]["images_per_s_max"] for n in loaders))
    for i, n in enumerate(loaders):
        if "ratio" in m[n]:
            ax1.annotate(
                f"{m[n]['ratio']:.2f}x",
                (i, m[n]["images_per_s_max"]),
                ha="center",
                va="bottom",
                xytext=(0, 4),
                textcoords="offset points",
            )
    if REFERENCE in m:
        for k, style in ((1.5, ":"), (2.0, "--")):
            ax1.axhline(
                m[REFERENCE]["images_per_s"] * k,
                color="grey",
                ls=style,
                lw=1,
                label=f"{k}x {REFERENCE}",
            )
        ax1.legend(loc="upper right", fontsize=8)
    ax1.set_xticks(range(len(loaders)), loaders, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("images/s (epoch, incl. start)")
    ax1.set_title("Throughput (median; bars: min-max of rounds)")
    names = [*loaders, *(n for n in m if n.startswith("alone:"))]
    ax2.bar(
        range(len(names)),
        [m[n]["cpu_ms_per_image"] for n in names],
        color=[*colors, *["#7f7f7f"] * (len(names) - len(loaders))],
    )
    ax2.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("CPU ms per image (whole process tree)")
    ax2.set_title("CPU per image (grey: no loader, one thread)")
    fig.suptitle(
        "4,000 JPEGs, 40 tar shards over HTTP (+20 ms), RandomResizedCrop 224, "
        f"batches of 64, {os.cpu_count()} cores"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def optional_versions() -> dict[str, str]:
    """The versions of turbojpeg (the region decode) and nvidia-dali, where installed."""
    from importlib import metadata

    found = {}
    for name in ("turbojpeg", "nvidia-dali-cuda120", "nvidia-dali-cuda130"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[*PIPELINES, ALONE],
        metavar="NAME",
        help=f"run only these: {', '.join(map(repr, [*PIPELINES, ALONE]))}",
    )
    side_by_side.add_save_argument(parser, SECTION)
    parser.add_argument("--plot", help="also plot it here (PNG)")
    parser.add_argument(
        "--replot",
        nargs="?",
        const=SECTION,
        metavar="SECTION",
        help=f"only print and plot (to --plot) a saved summary (default: {SECTION})",
    )
    parser.add_argument("--toy", action="store_true", help="one round of 200 images")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replot:
        saved = side_by_side.saved()[args.replot]
        summary = {"medians": saved["medians"], "targets": targets(saved["medians"])}
        args.images, args.reps = saved["workload"]["images"], saved["reps"]
        print(table(summary, args))
        if args.plot:
            plot(summary, args.plot)
        return
    if args.one:
        # This module by its name, not as __main__: what goes to workers pickles by that name.
        from benchmarks.probes import jpeg_shards

        if args.one == ALONE:
            print(json.dumps(jpeg_shards.run_alone(args.images)))
            return
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        print(json.dumps(jpeg_shards.run_pipeline(args.one, args.port, args.images)))
        return

    from examples.image_data import cached_shards
    from examples.latency_server import LatencyServer

    if args.toy:
        args.reps, args.images = 1, 2 * PER_SHARD
    bodies = [p.read_bytes() for p in cached_shards(args.images, PER_SHARD, seed=0)]
    load_before = os.getloadavg()

    def one(name: str) -> dict[str, Any]:
        if name == ALONE:
            return in_fresh_process("--one", ALONE, "--images", args.images)
        r = in_fresh_process("--one", name, "--port", server.port, "--images", args.images)
        print(
            f"  {name:22s} {r['images_per_s']:6.0f} images/s, first {r['ttfb_s']:.2f} s, "
            f"{r['cpu_ms_per_image']:.2f} CPU ms/image",
            file=sys.stderr,
            flush=True,
        )
        return r

    with LatencyServer(bodies, latency=LATENCY_S) as server:
        runs = side_by_side.rounds(args.only or [*PIPELINES, ALONE], args.reps, one)
    alone = runs.pop(ALONE, [])
    summary = summarise(runs, alone)
    print(table(summary, args))
    print(
        "load average before / after:",
        *(f"{x:.2f}" for x in load_before),
        "/",
        *(f"{x:.2f}" for x in os.getloadavg()),
    )
    if args.save:
        import PIL
        import torch
        import webdataset

        meta = {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "versions": {
                "torch": torch.__version__,
                "pillow": PIL.__version__,
                "webdataset": webdataset.__version__,
                "numpy": np.__version__,
                **optional_versions(),
            },
            "workload": {
                "images": args.images,
                "per_shard": PER_SHARD,
                "batch": BATCH,
                "latency_s": LATENCY_S,
                "shuffle_buffer": SHUFFLE,
                "size": SIZE,
            },
            "reps": args.reps,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
        side_by_side.save(args.save, {**meta, **summary})
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
