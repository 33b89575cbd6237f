"""Checkpoint state: what the consumer has seen, as the record written into a state and read
back from it (the resume point). :mod:`asyncloader._checkpoint.checks` checks a state against a
loader, :mod:`asyncloader._checkpoint.rebasing` makes it this loader's.

The state is what the consumer has received, never what is in flight: prefetched batches are
discarded and refetched on resume (principle 6). An epoch is replayed from its start (the RNG
state it began with reproduces the sampler's order and the per-sample seeds) and the batches
already delivered are stepped over. Everything in the dict is JSON-friendly.

A source's own state follows torchdata's protocol: the dataset's ``state_dict()`` and, for an
iterable source, that of the iterator its ``__iter__`` returned, saved together as
``{"dataset": ..., "iterator": ...}`` and restored in the order dataset, ``iter()``,
iterator.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import torch

from asyncloader._base import resolve_ranks, supplies_sampler, warn_at_caller
from asyncloader._checkpoint.layout import taken
from asyncloader._config import Options, SamplerCut


@dataclass(frozen=True)
class Resume:
    """Where a resumed epoch starts: first seq, seqs to step over, the source's own state."""

    start: int = 0
    skip: frozenset[int] = frozenset()
    source_state: Any = None


def fresh_state(num_workers: int) -> dict[str, Any]:
    """The state of an iterable source run in ``num_workers`` workers before its first batch
    (see :mod:`asyncloader._pipeline.worker_streams`): per worker, the batches delivered, whether
    its
    iteration ended and the source's own state after them; and whose turn is next."""
    return {
        "per_worker": [{"delivered": 0, "ended": False, "state": None} for _ in range(num_workers)],
        "next": 0,
    }


def next_epoch_state(final: dict[str, Any] | None, num_workers: int) -> dict[str, Any]:
    """The start of the epoch after one whose workers iterated their own copies and ended
    with ``final`` (their merge state after the last batch): each worker's dataset goes on
    from its own state then, its iteration from the start."""
    start = fresh_state(num_workers)
    for worker, ended in zip(start["per_worker"], (final or start)["per_worker"], strict=True):
        dataset = (ended["state"] or {}).get("dataset")
        if dataset is not None:
            worker["state"] = {"dataset": dataset, "iterator": None}
    return start


def warn_replayed(dataset: Any, batches: int) -> None:
    """A stateless iterable source resumed mid-epoch is replayed from its start."""
    warn_at_caller(  # the iter(loader) that started the epoch
        f"{type(dataset).__qualname__} (and the iterator its __iter__ returns) has no "
        "state_dict()/load_state_dict(): resuming replays it from the start, pulling and "
        f"dropping {batches} batches"
    )


def encode_rng(rng: tuple[str, torch.Tensor] | None) -> dict[str, Any] | None:
    if rng is None:
        return None
    kind, state = rng
    return {"kind": kind, "state": base64.b64encode(state.numpy().tobytes()).decode("ascii")}


def decode_rng(data: dict[str, Any] | None) -> tuple[str, torch.Tensor] | None:
    if data is None:
        return None
    raw = bytearray(base64.b64decode(data["state"]))
    return data["kind"], torch.frombuffer(raw, dtype=torch.uint8).clone()


def _num_replicas(options: Options) -> int | None:
    return getattr(options.sampler, "num_replicas", None)


def _batch_size(options: Options) -> int | None:
    if options.batch_size is not None:
        return options.batch_size
    return getattr(options.batch_sampler, "batch_size", None)


def fingerprint(options: Options) -> dict[str, Any]:
    """What a state depends on: batches only line up again when these are unchanged."""
    return {"batch_size": _batch_size(options), "num_replicas": _num_replicas(options)}


def ranks_state(options: Options, cuts: tuple[SamplerCut, ...]) -> dict[str, Any]:
    """``{"distributed": ...}`` for the loader's own rank sampler: what the epoch's global
    order depends on, and the interruptions whose remainder it is; for an iterable source
    with ``distributed=True``, the world size its position was saved at; else ``{}``."""
    sampler = options.own_sampler
    if sampler is None:
        if options.distributed and not options.kind.is_map:
            return {"distributed": {"world_size": world_size(options)}}
        return {}
    return {
        "distributed": {
            "world_size": sampler.world_size,
            "tail": sampler.tail,
            "dataset_len": sampler.n,
            "seed": sampler.seed,
            "shuffle": sampler.shuffle,
            "history": [list(cut) for cut in cuts],
        }
    }


def dataset_len(options: Options) -> int | None:
    """``len()`` of a map-style dataset (its sampler's order depends on it); ``None`` for an
    iterable source, a dataset without a length, or one that supplies its sampler (its own
    state carries its order: a Mix's length moves with its weights and world size)."""
    if not options.kind.is_map or supplies_sampler(options.dataset):
        return None
    try:
        return len(options.dataset)
    except TypeError:
        return None


def world_size(options: Options) -> int:
    return resolve_ranks(options.rank, options.world_size)[1]


def mid_epoch(state: dict[str, Any]) -> bool:
    """The state's epoch had begun: a batch was delivered."""
    return bool(state["next_batch"] or state["delivered_beyond"])


def owns(source: Any) -> list[Any]:
    """The own states (``{"dataset", "iterator"}`` or ``None``) in ``source``: one per
    worker iterating it, else one."""
    if source is None:
        return []
    if "per_worker" in source:
        return [worker["state"] for worker in source["per_worker"]]
    return [source]


def holds(source: Any) -> bool:
    """``source`` (asyncloader's form) holds a state of the source's own."""
    return any(
        own is not None and (own["dataset"] is not None or own["iterator"] is not None)
        for own in owns(source)
    )


def source_moves(state: dict[str, Any], options: Options) -> bool:
    """An iterable source that continues its epoch at another world size itself (it has
    ``elastic_state``, as ShardedSource) gets a state saved at another world size."""
    saved = state.get("distributed")
    elastic = callable(getattr(options.dataset, "elastic_state", None))
    if saved is None or not elastic or options.kind.is_map or not options.distributed:
        return False
    return bool(saved["world_size"] != world_size(options))


def resume_point(state: dict[str, Any]) -> Resume:
    return Resume(
        start=int(state["next_batch"]),
        skip=frozenset(int(s) for s in state["delivered_beyond"]),
        source_state=taken(state),
    )
