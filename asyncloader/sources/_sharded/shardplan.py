"""Which shards, and which samples of them, one rank reads in one epoch.

Rule (the same on every rank, so the ranks agree without talking): shuffle the shard order
with ``Random(f"{seed}:{epoch}")``; lay the shards' samples end to end in that order, ``total``
samples; rank ``r`` of ``world`` takes samples ``[r * per, (r + 1) * per)`` with
``per = total // world``. So every rank yields exactly ``per`` samples, the ranks never share
a sample, and at most ``world - 1`` samples (the tail of the shuffled order, different each
epoch) are left out of an epoch, as DistributedSampler's ``drop_last=True`` does. A shard that
straddles two ranks is read by both: one stops early, the other reads past the head it skips.

Workers (``fetch_in_workers``, each iterating its own copy) split their rank's range the same
way: worker ``w`` of ``n`` takes ``[w * per // n, (w + 1) * per // n)`` of it. So every rank's
workers hold the same counts, and end with the same partial batches: every rank makes the
same number of steps. Without counts (a single rank), worker ``w`` reads slices ``w, w + n,
...`` (``"slices"``, also the rule of states saved before this one).

Tail (``distributed_tail``): ``"drop"`` (above) cuts the sequence to ``world * per``;
``"pad"`` makes ``per = ceil(total / world)`` and extends the sequence to ``world * per`` by
repeating its head, so every sample comes, fewer than ``world`` of them twice.

The same rule splits what an interrupted epoch had left (:mod:`.remainder`): a sequence of
*runs*, each a shard's remaining sample indices, laid end to end in the epoch's order.

This needs the number of samples in each shard (``samples_per_shard``, or counted by reading
the shards once; one int counts every shard but the last, which is read to count it); a
single rank can do without (it reads every shard, whole).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from asyncloader._base import share

TAILS = ("drop", "pad")


class Slice(NamedTuple):
    """Samples ``[skip, skip + take)`` of shard ``shard`` (``take=None``: to its end); with
    ``picks``, samples ``picks[skip:skip + take]`` (sorted) instead."""

    shard: int
    skip: int
    take: int | None
    picks: tuple[int, ...] | None = None

    def sample(self, k: int) -> int:
        """The shard's index of the slice's ``k``-th sample."""
        return self.skip + k if self.picks is None else self.picks[self.skip + k]


class Run(NamedTuple):
    """The samples of shard ``shard`` in a sequence to split: ``length`` of them, ``0, 1,
    ...`` or, with ``picks``, those indices (sorted)."""

    shard: int
    length: int
    picks: tuple[int, ...] | None = None

    def indices(self) -> Sequence[int]:
        return range(self.length) if self.picks is None else self.picks


def shard_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The shard order of ``epoch``: a permutation of ``range(n)`` fixed by seed and epoch."""
    order = list(range(n))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def check_tail(tail: str) -> None:
    if tail not in TAILS:
        raise ValueError(f"distributed_tail must be 'pad' or 'drop', got {tail!r}")


def plan(
    counts: Sequence[int] | None,
    n_shards: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int,
    world_size: int,
    worker: int = 0,
    workers: int = 1,
    tail: str = "drop",
) -> list[Slice]:
    """The slices rank ``rank`` reads in ``epoch``, in reading order (see the module rule):
    worker ``worker`` of ``workers`` iterating its own copy reads part ``worker`` of them."""
    order = shard_order(n_shards, seed, epoch, shuffle)
    if counts is None:
        if world_size > 1:
            raise ValueError(
                "samples_per_shard (or count_samples()) is needed to split shards across "
                f"{world_size=} ranks with equal sample counts"
            )
        return [Slice(shard, 0, None) for shard in order][worker::workers]
    runs = [Run(shard, counts[shard]) for shard in order]
    return split(runs, rank, world_size, worker, workers, tail)


def split(
    runs: Sequence[Run], rank: int, world_size: int, worker: int, workers: int, tail: str
) -> list[Slice]:
    """Part ``worker`` of ``workers`` of rank ``rank``'s share of ``runs`` laid end to end."""
    total = sum(run.length for run in runs)
    per = share(total, world_size, tail)
    lo = rank * per
    lo, hi = lo + worker * per // workers, lo + (worker + 1) * per // workers
    slices: list[Slice] = []
    while lo < hi:  # past the end only with "pad": the sequence's head again
        first = lo % total
        last = min(total, first + hi - lo)
        slices += _within(runs, first, last)
        lo += last - first
    return slices


def _within(runs: Sequence[Run], lo: int, hi: int) -> list[Slice]:
    """The slices of samples ``[lo, hi)`` of ``runs`` laid end to end."""
    slices, start = [], 0
    for run in runs:
        end = start + run.length
        first, last = max(lo, start), min(hi, end)
        if first < last:
            slices.append(Slice(run.shard, first - start, last - first, run.picks))
        start = end
    return slices


def samples_per_rank(counts: Sequence[int], world_size: int, tail: str = "drop") -> int:
    """Samples each rank yields per epoch of shards holding ``counts``."""
    return share(sum(counts), world_size, tail)


def parse_counts(samples_per_shard: int | Sequence[int] | None, n: int) -> list[int] | None:
    """``samples_per_shard`` as one count per shard (None stays None), checked."""
    if samples_per_shard is None:
        return None
    if isinstance(samples_per_shard, bool):
        raise TypeError("samples_per_shard must be an int or a sequence of ints, got bool")
    if isinstance(samples_per_shard, int):
        counts = [samples_per_shard] * n
    else:
        counts = [int(c) for c in samples_per_shard]
    if len(counts) != n:
        raise ValueError(f"samples_per_shard has {len(counts)} counts for {n} shards")
    if any(c < 1 for c in counts):
        raise ValueError("samples_per_shard must count at least 1 sample per shard")
    return counts


#: How to give a shard set's counts, for the error about a shard that holds other than declared.
COUNTS_FIX = (
    "give each shard's count, in shard order (samples_per_shard=[1000, ..., 40]; one int "
    "says that every shard holds that many and the last at most), or leave samples_per_shard "
    "out and each rank counts them (count_samples() returns the counts to pass next time)"
)


def miscounted(shard: int, declared: int | None, seen: int | None) -> ValueError:
    """The error for ``shard_urls[shard]`` holding ``seen`` samples (None: more) where
    ``samples_per_shard`` declared ``declared`` (known wherever a slice has a length)."""
    if seen is None:
        what = f"holds more than {declared} samples (samples_per_shard); the rest would be lost"
    else:
        what = f"holds {seen} samples, fewer than samples_per_shard says ({declared})"
    return ValueError(f"shard_urls[{shard}] {what}: {COUNTS_FIX}")


def check_shuffle(shuffle_buffer: int, shard_concurrency: int, shuffle_initial: int | None) -> int:
    """Checks the shuffle and concurrency options; returns ``shuffle_initial`` (its default
    resolved)."""
    for name, value in (
        ("shuffle_buffer", shuffle_buffer),
        ("shard_concurrency", shard_concurrency),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__qualname__}")
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if shuffle_initial is None:
        shuffle_initial = min(100, shuffle_buffer)
    if isinstance(shuffle_initial, bool) or not isinstance(shuffle_initial, int):
        raise TypeError(f"shuffle_initial must be an int, got {type(shuffle_initial).__qualname__}")
    if not 1 <= shuffle_initial <= shuffle_buffer:
        raise ValueError(
            f"shuffle_initial={shuffle_initial} must be between 1 and "
            f"shuffle_buffer={shuffle_buffer}"
        )
    return shuffle_initial
