"""Checkpoint state: what the consumer has seen, and how a new loader continues from it.

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
import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from asyncloader._base.ranks import resolve_ranks, share
from asyncloader._checkpoint.layout import SOURCE_KEYS, placed, taken
from asyncloader._config.options import Options
from asyncloader._config.rank_sampler import SamplerCut, remainder_len

#: 3 added ``"distributed"`` (the loader's own rank sampler: world, seed, length, remainder;
#: for an iterable source, the world size only: it keeps its position itself);
#: 4 moved ``source_state`` to StatefulDataLoader's places (:mod:`asyncloader._checkpoint.layout`).
STATE_VERSION = 4
_READABLE = (2, 3, 4)


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
    warnings.warn(
        f"{type(dataset).__qualname__} (and the iterator its __iter__ returns) has no "
        "state_dict()/load_state_dict(): resuming replays it from the start, pulling and "
        f"dropping {batches} batches",
        UserWarning,
        stacklevel=6,  # the iter(loader) that started the epoch
    )


def encode_rng(rng: tuple[str, torch.Tensor] | None) -> dict | None:
    if rng is None:
        return None
    kind, state = rng
    return {"kind": kind, "state": base64.b64encode(state.numpy().tobytes()).decode("ascii")}


def decode_rng(data: dict | None) -> tuple[str, torch.Tensor] | None:
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


def fingerprint(options: Options) -> dict:
    """What a state depends on: batches only line up again when these are unchanged."""
    return {"batch_size": _batch_size(options), "num_replicas": _num_replicas(options)}


def ranks_state(options: Options, cuts: tuple[SamplerCut, ...]) -> dict[str, Any]:
    """``{"distributed": ...}`` for the loader's own rank sampler: what the epoch's global
    order depends on, and the interruptions whose remainder it is; for an iterable source
    with ``distributed=True``, the world size its position was saved at; else ``{}``."""
    sampler = options.own_sampler
    if sampler is None:
        if options.distributed and not options.kind.is_map:
            return {"distributed": {"world_size": _world_size(options)}}
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


def check_state(state: Any, options: Options) -> None:
    """Validates a state dict against this loader before it is used.

    Raises:
        TypeError: ``state`` is not a dict.
        ValueError: Another version, or saved with another batch size or world size (one
            of the loader's own rank sampler, or of an iterable source with
            ``elastic_state``, may differ), dataset length, seed or shuffle.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__qualname__}")
    if state.get("version") not in _READABLE:
        raise ValueError(
            f"state version={state.get('version')!r} is not one of {_READABLE}: it was not "
            "saved by this asyncloader"
        )
    if not _source_moves(state, options):
        _check_placement(state, options)
    elastic = _check_ranks(state, options)
    for name, now in fingerprint(options).items():
        saved = state.get(name)
        if saved != now and not (elastic and name == "num_replicas"):
            raise ValueError(
                f"state was saved with {name}={saved}, this loader has {name}={now}: the "
                "batches would not line up; resume with the same value"
            )


def _check_ranks(state: dict, options: Options) -> bool:
    """Checks a state of the loader's own rank sampler against this one's; True when both
    have one (then the world size may differ)."""
    saved, now = state.get("distributed"), ranks_state(options, ()).get("distributed")
    if saved is None or now is None:
        return False
    if options.own_sampler is None:  # an iterable source's
        if _source_moves(state, options):
            _check_in_order(state, saved["world_size"], now["world_size"])
        return False
    for name, what in (
        ("dataset_len", "a dataset of"),
        ("seed", "seed"),
        ("shuffle", "shuffle="),
    ):
        if saved[name] != now[name]:
            raise ValueError(
                f"state was saved for {what} {saved[name]}, this loader has {what} {now[name]}: "
                "its order would not be the one the state continues"
            )
    if saved["world_size"] != now["world_size"]:
        _check_in_order(state, saved["world_size"], now["world_size"])
    return True


def _check_in_order(state: dict, saved: int, now: int) -> None:
    if state.get("delivered_beyond"):
        raise ValueError(
            f"state was saved at world_size={saved} with batches delivered out of order "
            f"({state['delivered_beyond']}); at world_size={now} only an in-order position "
            "carries over: save with in_order=True"
        )


def _world_size(options: Options) -> int:
    return resolve_ranks(options.rank, options.world_size)[1]


def _source_moves(state: dict, options: Options) -> bool:
    """An iterable source that continues its epoch at another world size itself (it has
    ``elastic_state``, as ShardedSource) gets a state saved at another world size."""
    saved = state.get("distributed")
    elastic = callable(getattr(options.dataset, "elastic_state", None))
    if saved is None or not elastic or options.kind.is_map or not options.distributed:
        return False
    return bool(saved["world_size"] != _world_size(options))


def rebase(state: dict, options: Options) -> dict:
    """``state`` as this loader's world size sees it (elastic resume, see
    :mod:`asyncloader._config.rank_sampler`): saved at another world size, the batches every rank
    took become one more cut of the epoch, whose remainder this loader's ranks split."""
    if _source_moves(state, options):
        return _rebase_source(state, options)
    saved, sampler = state.get("distributed"), options.own_sampler
    if saved is None or sampler is None or saved["world_size"] == sampler.world_size:
        return state
    cuts = [tuple(cut) for cut in saved["history"]]
    left = share(remainder_len(saved["dataset_len"], cuts), saved["world_size"], saved["tail"])
    taken = min(int(state["next_batch"]) * (options.batch_size or 1), left)
    if taken:
        cuts.append((saved["world_size"], taken, saved["tail"]))
    ranks = {
        **saved,
        "world_size": sampler.world_size,
        "tail": sampler.tail,
        "history": [list(cut) for cut in cuts],
    }
    return {
        **state,
        "num_replicas": sampler.world_size,
        "next_batch": 0,
        "delivered_beyond": [],
        "distributed": ranks,
    }


def _rebase_source(state: dict, options: Options) -> dict:
    """An iterable source's state saved at another world size: its streams' own states (one,
    or one per worker with ``fetch_in_workers``) become the one state with which each of
    this loader's streams, in this placement, continues the epoch (the source's
    ``elastic_state``). The batch count goes on: it numbers the epoch's steps."""
    saved = taken(state) or {}
    if "per_worker" in saved:
        streams = [(w["state"] or {}).get("dataset") for w in saved["per_worker"]]
    else:
        streams = [saved.get("dataset")]
    kept = None
    if any(s is not None for s in streams):
        kept = {"dataset": options.dataset.elastic_state(streams), "iterator": None}
    source: Any = kept
    if options.worker_streams:
        source = fresh_state(options.num_workers)
        for worker in source["per_worker"]:
            worker["state"] = copy.deepcopy(kept)
    world = _world_size(options)
    kept_keys = {k: v for k, v in state.items() if k not in SOURCE_KEYS}
    return {
        **kept_keys,
        **placed(source, options),
        "version": STATE_VERSION,
        "delivered_beyond": [],
        "distributed": {**state["distributed"], "world_size": world},
    }


def _check_placement(state: dict, options: Options) -> None:
    """An iterable source's position means something else in the workers' iterations
    (``fetch_in_workers``) than in a single one: resume where it was saved."""
    saved = taken(state)
    per_worker = saved.get("per_worker") if isinstance(saved, dict) else None
    in_workers = per_worker is not None
    mid_epoch = bool(state.get("next_batch")) or bool(state.get("delivered_beyond"))
    if options.kind.is_map or not mid_epoch:
        return
    if in_workers != options.worker_streams:
        raise ValueError(
            f"state was saved with fetch_in_workers={in_workers}, this loader has "
            f"fetch_in_workers={options.worker_streams}: an iterable source's position does not "
            "carry over between the two placements; resume with the same value"
        )
    saved_workers = len(per_worker) if per_worker is not None else options.num_workers
    if saved_workers != options.num_workers:
        raise ValueError(
            f"state was saved with num_workers={saved_workers} iterating the source, "
            f"this loader has num_workers={options.num_workers}: each worker's own iteration "
            "continues, so resume with the same num_workers"
        )


def resume_point(state: dict) -> Resume:
    return Resume(
        start=int(state["next_batch"]),
        skip=frozenset(int(s) for s in state["delivered_beyond"]),
        source_state=taken(state),
    )
