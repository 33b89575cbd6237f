"""Seeds of workers, epochs and samples, and seeding the global RNGs around user code.

A worker's RNGs start from ``base_seed + worker_id`` (DataLoader's rule). With
``seed_per_sample`` every sample (and every batch's collate) gets a seed derived from the epoch
seed and its index alone, so the draws do not depend on which process or thread ran it.
"""

from __future__ import annotations

import random
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def draw_seed(generator: torch.Generator | None) -> int:
    """A base seed drawn as DataLoader draws it, so a seeded generator gives the same shuffle."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def seed_all(seed: int) -> None:
    """Seeds the global ``torch`` (CPU), ``random`` and ``numpy`` generators.

    ``torch.default_generator`` rather than ``torch.manual_seed``: the latter also visits every
    accelerator backend and costs ~170 us, too much to pay per sample.
    """
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(epoch_seed: int, key: Any) -> int:
    """The seed of one sample (``key`` = its index) or batch, the same in every process.

    Non-integer indices hash through ``crc32(repr)``: ``hash()`` of a str differs per process.
    """
    if not isinstance(key, int):
        key = zlib.crc32(repr(key).encode())
    return _mix(epoch_seed ^ _mix(key & _MASK64)) >> 1


#: Seeding the global RNGs and drawing from them must not interleave across threads of one
#: process (with num_workers=0 the fetch threads and the transform thread share them).
RNG_LOCK = threading.Lock()


def call_seeded(epoch_seed: int | None, key: Any, fn: Callable[[Any], Any], arg: Any) -> Any:
    """``fn(arg)``, with the global RNGs seeded from ``(epoch_seed, key)`` first when set."""
    if epoch_seed is None:
        return fn(arg)
    with RNG_LOCK:
        seed_all(sample_seed(epoch_seed, key))
        return fn(arg)
