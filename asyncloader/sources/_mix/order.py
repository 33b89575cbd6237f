"""The order of a map-style source inside a :class:`~asyncloader.sources.Mix`, on this rank.

Source epoch ``k`` of source ``name`` is ``torch.randperm(n)`` seeded from (seed, name, k)
(``range(n)`` unshuffled), split across ranks as the loader's rank sampler splits its own:
rows of ``world_size``, rank ``r`` takes the ``r``-th entry of each, the tail padded (head
repeated) or dropped. A resume at another world size cuts it: what every rank of ``W`` had
not taken, ``order[taken * W:]``, is split again (the arithmetic of
:mod:`asyncloader._base.ranks`, the rule of ``asyncloader._config.rank_sampler``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from asyncloader._base import remainder_len, remainder_span, share, split_span
from asyncloader.sources._mix.draw import CHUNK, Layout, MemberCut


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``, the same in every process and Python version."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def share_len(n: int, cuts: Sequence[MemberCut], layout: Layout) -> int:
    """Samples of an order of ``n`` cut by ``cuts`` that this rank takes."""
    return share(remainder_len(n, cuts), layout.world_size, layout.tail)


def rank_order(
    n: int, key: tuple[Any, ...], shuffle: bool, cuts: Sequence[MemberCut], layout: Layout
) -> torch.Tensor:
    """This rank's order of a map-style source's epoch: the permutation seeded from
    ``key`` (seed, name, epoch), cut by ``cuts``, split by ``layout``."""
    if shuffle:
        generator = torch.Generator().manual_seed(stable_seed(*key))
        order = torch.randperm(n, generator=generator)
    else:
        order = torch.arange(n)
    for world_size, taken, tail in cuts:
        start, end = remainder_span(len(order), world_size, taken, tail)
        order = order[start:end]
    copies, entries = split_span(len(order), *layout)
    return (order.repeat(copies) if copies > 1 else order)[entries]


class Order:
    """One rank's order of a map-style source's epoch, read as ints 4096 at a time."""

    __slots__ = ("_chunk", "_items", "_tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._chunk = -1
        self._items: list[int] = []

    def items(self, start: int, end: int) -> np.ndarray:
        """Entries ``[start, end)``."""
        return self._tensor[start:end].numpy()

    def __getitem__(self, k: int) -> int:
        chunk = k // CHUNK
        if chunk != self._chunk:
            self._items = self._tensor[chunk * CHUNK : (chunk + 1) * CHUNK].tolist()
            self._chunk = chunk
        return self._items[k % CHUNK]
