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

This needs the number of samples in each shard (``samples_per_shard``, or counted by reading
the shards once); a single rank can do without (it reads every shard, whole).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple


class Slice(NamedTuple):
    """Samples ``[skip, skip + take)`` of shard ``shard`` (``take=None``: to its end)."""

    shard: int
    skip: int
    take: int | None


def resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit ``(rank, world_size)``, else torch.distributed's when initialised, else (0, 1)."""
    if rank is None and world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"rank and world_size go together, got {rank=} and {world_size=}")
    check_ranks(rank, world_size)
    return rank, world_size


def check_ranks(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"{world_size=} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"{rank=} must be in [0, {world_size})")


def shard_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The shard order of ``epoch``: a permutation of ``range(n)`` fixed by seed and epoch."""
    order = list(range(n))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


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
    per = sum(counts) // world_size
    lo = rank * per
    lo, hi = lo + worker * per // workers, lo + (worker + 1) * per // workers
    slices, start = [], 0
    for shard in order:
        end = start + counts[shard]
        first, last = max(lo, start), min(hi, end)
        if first < last:
            slices.append(Slice(shard, first - start, last - first))
        start = end
    return slices


def per_rank(counts: Sequence[int], world_size: int) -> int:
    """Samples each rank yields per epoch."""
    return sum(counts) // world_size


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
