"""Seeds of workers, epochs, batches and samples, and seeding the global RNGs around user code.

A worker's RNGs start from ``base_seed + worker_id`` (DataLoader's rule). Then, by default,
each batch a worker process runs first seeds them from ``(epoch seed, batch number)``: the
draws of ``__getitem__``, ``transform`` and ``collate`` depend on the batch alone, never on
which worker ran it, so they repeat for any ``num_workers`` and after resume (DataLoader gets
there by sending batch i to worker i % n, for one worker count). Batches run in the training
process itself (``num_workers=0``) are not reseeded: they draw from your global RNGs, as under
DataLoader. A ``worker_init_fn`` that seeds (or draws from) any of the three RNGs takes over
seeding in its worker, as under DataLoader: that worker's batches are then not reseeded.
With ``seed_per_sample`` every sample (and every batch's collate) gets a seed
derived from the epoch seed and its index alone, in every process.
"""

from __future__ import annotations

import os
import random
import threading
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple, cast

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


def rng_states() -> tuple[Any, ...]:
    """The states of the global ``torch`` (CPU), ``random`` and ``numpy`` RNGs, to compare."""
    # The global RandomState is an MT19937, whose legacy state is always this tuple.
    kind, key, pos, gauss, cached = cast(
        "tuple[str, np.ndarray[Any, Any], int, int, float]", np.random.get_state()
    )
    return (
        torch.initial_seed(),
        bytes(torch.get_rng_state().numpy()),
        random.getstate(),
        (kind, key.tobytes(), pos, gauss, cached),
    )


#: In a worker process: its ``worker_init_fn`` seeded or drew from the global RNGs, so batches
#: are not reseeded there (:meth:`Seeds.seed_batch`).
_user_seeded = False


def leave_seeding_to_user() -> None:
    global _user_seeded
    _user_seeded = True


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


def seed_stream(seed: int) -> None:
    """Seeds a worker's global RNGs as its own iteration of an iterable source begins (once
    per epoch, DataLoader's ``base_seed + worker_id``), unless its ``worker_init_fn`` took
    seeding over."""
    if not _user_seeded:
        seed_all(seed)


class Seeds(NamedTuple):
    """How the user's code in an epoch's batches is seeded.

    Attributes:
        epoch: The epoch's seed (drawn from ``generator``, replayed on resume).
        per_sample: ``seed_per_sample``: seed before every sample and every collate.
        home_pid: The training process, whose global RNGs are the user's: never reseeded per
            batch.
    """

    epoch: int
    per_sample: bool
    home_pid: int

    @classmethod
    def of(cls, epoch_seed: int, per_sample: bool) -> Seeds:
        return cls(epoch_seed, per_sample, os.getpid())

    @property
    def sample_seeds(self) -> int | None:
        """The seed per-sample seeds derive from (``per_sample``), else ``None``."""
        return self.epoch if self.per_sample else None

    def seed_batch(self, seq: int) -> None:
        """Seeds this process's global RNGs for batch ``seq``, once, before its first sample:
        only in a process other than the training process, and not when every sample is
        seeded anyway, nor where a ``worker_init_fn`` took over seeding."""
        if not self.per_sample and not _user_seeded and os.getpid() != self.home_pid:
            seed_all(sample_seed(self.epoch, -1 - seq))
