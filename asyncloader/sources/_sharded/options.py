"""A :class:`~.source.ShardedSource`'s constructor arguments, checked, and the client its
URLs' scheme needs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from asyncloader._base import check_ranks
from asyncloader.sources._client import Client
from asyncloader.sources._files import FileClient
from asyncloader.sources._http import HTTPClient
from asyncloader.sources._objectstore import StoreClient
from asyncloader.sources._sharded.shardplan import check_shuffle, check_tail, parse_counts


def checked_arguments(
    shard_urls: Sequence[str],
    samples_per_shard: int | Sequence[int] | None,
    decode: Callable[[dict[str, Any]], Any] | None,
    shuffle: tuple[int, int, int | None],
    ranks: tuple[int | None, int | None],
    distributed_tail: str,
    on_error: str,
) -> tuple[list[str], list[int] | None, int]:
    """``(urls, counts, shuffle_initial)``: the shards as strings, their counts (one per shard,
    ``None`` when not given) and ``shuffle_initial`` resolved, from ``shuffle`` =
    ``(shuffle_buffer, shard_concurrency, shuffle_initial)``.

    Raises:
        TypeError: ``decode`` is not callable.
        ValueError: An argument is out of range or two disagree (``rank`` without
            ``world_size``, ``on_error="skip"`` without ``samples_per_shard``...).
    """
    if decode is not None and not callable(decode):
        raise TypeError(f"decode must be callable or None, got {type(decode).__qualname__}")
    if isinstance(shard_urls, str) or not shard_urls:
        raise ValueError("shard_urls must be a non-empty sequence of URLs or paths")
    urls = [str(u) for u in shard_urls]
    initial = check_shuffle(*shuffle)
    counts = parse_counts(samples_per_shard, len(urls))
    rank, world_size = ranks
    if (rank is None) != (world_size is None):
        raise ValueError(f"rank and world_size go together, got {rank=} and {world_size=}")
    if rank is not None and world_size is not None:
        check_ranks(rank, world_size)
    check_tail(distributed_tail)
    if on_error == "skip" and counts is None:
        raise ValueError("on_error='skip' needs samples_per_shard, to count what it skips")
    return urls, counts, initial


def make_client(url: str, **opts: Any) -> Client:
    """The client for the scheme of ``url``: HTTP, local file, or an fsspec store."""
    if url.startswith(("http://", "https://")):
        client = HTTPClient(
            timeout=opts["timeout"],
            headers=opts["headers"],
            max_connections=opts["max_connections"],
            max_object_size=opts["max_object_size"],
        )
        return client
    if "://" not in url or url.startswith("file://"):
        return FileClient(opts["max_object_size"])
    return StoreClient(
        url.partition("://")[0],
        opts["storage_options"] or {},
        max_connections=opts["max_connections"],
        max_object_size=opts["max_object_size"],
    )
