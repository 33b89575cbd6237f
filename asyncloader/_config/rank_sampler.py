"""The sampler of ``distributed=True``: one global order per epoch, split across ranks.

Rule (the same on every rank, so ranks agree without talking): the epoch's ``order`` is
``torch.randperm(n)`` drawn from a generator seeded with ``seed + epoch`` (so the partition is
``DistributedSampler``'s), or ``range(n)`` unshuffled. It is cut into rows of ``world_size``;
rank ``r`` takes the ``r``-th entry of every row. Tail ``"pad"`` first extends ``order`` to
whole rows by repeating its head (every sample at least once); ``"drop"`` cuts it to whole
rows (each sample at most once, fewer than ``world_size`` left out). The arithmetic is
:mod:`asyncloader._base.ranks`'s, shared with ``asyncloader.sources.Mix``.

Elastic resume: ranks step together, so an epoch interrupted after every rank of ``W`` took
``c`` samples has taken the first ``c`` rows. What it had still to give is ``order[c * W:]``
(for ``"drop"``, up to its cut; for ``"pad"``, without the repeats): that *remainder* is the
order that the new ranks split by the same rule. Interrupted again, the remainder is cut
again, so :attr:`RankSampler.history` lists one ``(world_size, taken, tail)`` per interruption
of the current epoch, which is all it takes to rebuild its order. Nothing in the remainder
was given before, and everything given after it was in it: exactly once across the resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from asyncloader._base import (
    remainder_len,
    remainder_span,
    resolve_ranks,
    share,
    split_span,
)

TAILS = ("pad", "drop")

#: One interruption of a map-style epoch: the world size then, samples each rank had taken,
#: its tail (a sharded stream's is ``asyncloader.sources._sharded.remainder.StreamCut``).
SamplerCut = tuple[int, int, str]


def remainder(order: list[int], world_size: int, taken: int, tail: str) -> list[int]:
    """What ``order`` still had to give after every rank of ``world_size`` took ``taken``."""
    if not 0 <= taken <= share(len(order), world_size, tail):
        raise ValueError(f"{taken=} is outside an epoch of {len(order)} at {world_size=}")
    start, end = remainder_span(len(order), world_size, taken, tail)
    return order[start:end]


def split(order: list[int], rank: int, world_size: int, tail: str) -> list[int]:
    """Rank ``rank``'s share of ``order``: the ``rank``-th entry of every row."""
    copies, entries = split_span(len(order), rank, world_size, tail)
    return (order * copies if copies > 1 else order)[entries]


class RankSampler(Sampler[int]):
    """This rank's indices of each epoch (see the module rule).

    Args:
        n: Samples in the dataset.
        rank, world_size: This rank's place; ``None``: torch.distributed's when initialised
            (asked anew each time), else a single rank.
        shuffle: A new permutation each epoch (else the dataset's order).
        seed: Seeds the permutations; the same on every rank.
        tail: ``"pad"`` or ``"drop"``.

    ``set_epoch`` picks the epoch and forgets a remainder; ``history`` (set after it) makes the
    epoch the remainder left by those interruptions.
    """

    def __init__(
        self,
        n: int,
        *,
        rank: int | None,
        world_size: int | None,
        shuffle: bool,
        seed: int,
        tail: str,
    ) -> None:
        self.n, self._place = n, (rank, world_size)
        self.shuffle, self.seed, self.tail = shuffle, seed, tail
        self.epoch = 0
        self.history: list[SamplerCut] = []

    @property
    def rank(self) -> int:
        return resolve_ranks(*self._place)[0]

    @property
    def world_size(self) -> int:
        return resolve_ranks(*self._place)[1]

    @property
    def num_replicas(self) -> int:
        """The world size, under ``DistributedSampler``'s name."""
        return self.world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.history = int(epoch), []

    def epoch_order(self, history: Sequence[SamplerCut] = ()) -> list[int]:
        """The global order of the current epoch, cut by ``history``."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        for world_size, taken, tail in history:
            order = remainder(order, world_size, taken, tail)
        return order

    def __iter__(self) -> Iterator[int]:
        rank, world_size = resolve_ranks(*self._place)
        return iter(split(self.epoch_order(self.history), rank, world_size, self.tail))

    def __len__(self) -> int:
        return share(remainder_len(self.n, self.history), self.world_size, self.tail)
