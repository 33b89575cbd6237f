"""Deterministic JPEG images and WebDataset tar shards of them: the image example's data, and the
image benchmarks' and tests'.

Each image is ``320-500 x 240-375`` pixels, a smooth random field with fine grain on top, saved
at JPEG quality 90: about 70 KB, close to a photo of that size, so decoding and resizing cost
what they cost on real photos. The same ``seed`` gives the same bytes on every machine (one
numpy ``Generator``, Pillow's encoder). Labels are ``i % classes``. A shard holds samples
``{key}.jpg`` and ``{key}.cls`` (the label in ASCII), as ``webdataset`` writes them, so both
webdataset and :class:`asyncloader.sources.ShardedSource` read them.

``examples/train_images.py`` imports this module as ``image_data``; benchmarks and tests, run
from the repository root, as ``examples.image_data``.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def make_jpeg(rng: np.random.Generator, quality: int = 90) -> bytes:
    """One JPEG of random size and content drawn from ``rng``."""
    from PIL import Image

    width, height = int(rng.integers(320, 501)), int(rng.integers(240, 376))
    coarse = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    grain = rng.integers(-26, 27, (height, width, 1), dtype=np.int16)
    pixels = np.clip(field.astype(np.int16) + grain, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()


def make_images(n: int, seed: int = 0, classes: int = 10) -> list[tuple[str, bytes, int]]:
    """``n`` samples ``(key, jpeg, label)``; key ``"{i:06d}"``, label ``i % classes``."""
    rng = np.random.default_rng(seed)
    return [(f"{i:06d}", make_jpeg(rng), i % classes) for i in range(n)]


def tar_shard(samples: Sequence[tuple[str, bytes, int]]) -> bytes:
    """One WebDataset tar shard: ``{key}.jpg`` and ``{key}.cls`` per sample, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, jpeg, label in samples:
            for name, data in ((f"{key}.jpg", jpeg), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tar_shards(samples: Sequence[tuple[str, bytes, int]], per_shard: int = 100) -> list[bytes]:
    """The samples split in order into shards of ``per_shard`` (the last may hold fewer)."""
    return [tar_shard(samples[i : i + per_shard]) for i in range(0, len(samples), per_shard)]


def shard_sizes(n: int, per_shard: int = 100) -> list[int]:
    """The samples in each of the shards ``tar_shards`` makes of ``n`` samples: ``per_shard``,
    the last fewer when ``per_shard`` does not divide ``n`` (``samples_per_shard`` for them)."""
    return [min(per_shard, n - start) for start in range(0, n, per_shard)]


def cached_shards(
    n: int, per_shard: int = 100, seed: int = 0, directory: str | Path = ".cache/image_shards"
) -> list[Path]:
    """Tar shards of ``make_images(n, seed)`` written once under ``directory`` and reused:
    ``shard-000000.tar``, ... (a few seconds per thousand images the first time)."""
    where = Path(directory) / f"n{n}-per{per_shard}-seed{seed}"
    paths = [where / f"shard-{i:06d}.tar" for i in range(-(-n // per_shard))]
    if not all(p.exists() for p in paths):
        where.mkdir(parents=True, exist_ok=True)
        for path, shard in zip(paths, tar_shards(make_images(n, seed), per_shard), strict=True):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(shard)
            tmp.replace(path)
    return paths
