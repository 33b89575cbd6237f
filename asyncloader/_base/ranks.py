"""Rank arithmetic shared by the loader's rank sampler, the sharded source and ``Mix``: which
``(rank, world_size)`` this process is, and how an order splits across ranks.

Split rule: an order is cut into rows of ``world_size``; rank ``r`` takes the ``r``-th entry of
each. Tail ``"pad"`` first extends it to whole rows by repeating its head, ``"drop"`` cuts it
to whole rows. An epoch interrupted after every rank took ``taken`` leaves its *remainder*,
``order[taken * world_size : end]`` (``end``: the order's, or its cut for ``"drop"``), which
the ranks of a resume split by the same rule (see ``asyncloader._config.rank_sampler``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


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


def share(total: int, world_size: int, tail: str) -> int:
    """Samples each rank of ``world_size`` takes of ``total``: padded up to equal shares
    (``tail="pad"``, samples repeat) or cut down to them (``"drop"``)."""
    return -(-total // world_size) if tail == "pad" else total // world_size


def remainder_span(n: int, world_size: int, taken: int, tail: str) -> tuple[int, int]:
    """``(start, end)``: the remainder of an order of ``n`` after every rank of
    ``world_size`` took ``taken`` is ``order[start:end]`` (empty when ``start >= end``)."""
    end = n if tail == "pad" else share(n, world_size, tail) * world_size
    return taken * world_size, end


def remainder_len(n: int, cuts: Iterable[Sequence[Any]]) -> int:
    """``len()`` of an order of ``n`` cut by each ``(world_size, taken, tail)`` of ``cuts``
    in turn (see :func:`remainder_span`)."""
    for world_size, taken, tail in cuts:
        start, end = remainder_span(n, world_size, taken, tail)
        n = max(end - start, 0)
    return n


def split_span(n: int, rank: int, world_size: int, tail: str) -> tuple[int, slice]:
    """How rank ``rank`` takes its share of an order of ``n``: ``(copies, entries)``, its
    entries ``entries`` of the order repeated ``copies`` times (more than once only where
    ``"pad"`` repeats the head)."""
    total = share(n, world_size, tail) * world_size
    copies = -(-total // n) if tail == "pad" and n else 1
    return copies, slice(rank, total, world_size)
