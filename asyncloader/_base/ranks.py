"""Rank arithmetic shared by the loader's rank sampler and the sharded source: which
``(rank, world_size)`` this process is.
"""

from __future__ import annotations


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
