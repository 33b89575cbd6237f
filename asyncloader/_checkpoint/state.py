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
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from asyncloader._base import resolve_ranks, share, supplies_sampler
from asyncloader._checkpoint.layout import SOURCE_KEYS, placed, taken
from asyncloader._checkpoint.shape import check_shape, decode_rng_bytes, refuse
from asyncloader._config import Options, RankSampler, SamplerCut, remainder_len

#: Samplers whose ``len()`` is exactly what they yield: a position past it is refused.
_EXACT_SAMPLERS = (
    SequentialSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    DistributedSampler,
    RankSampler,
)


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


def check_state(state: Any, options: Options, allow_length_change: bool = False) -> None:
    """Validates a state dict against this loader before any of it is used: its shape
    (:mod:`asyncloader._checkpoint.shape`), then that it continues this loader's order.

    Raises:
        TypeError: ``state`` is not a dict.
        ValueError: A field is missing, of the wrong type or out of range; another version;
            saved with another batch size or world size (one of the loader's own rank
            sampler, or of an iterable source with ``elastic_state``, may differ), seed,
            shuffle, RNG kind, placement of an iterable source, or dataset length (unless
            ``allow_length_change``). The message names the field.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__qualname__}")
    check_shape(state)
    _check_source(state, options)
    if not _source_moves(state, options):
        _check_placement(state, options)
    _check_length(state, options, allow_length_change)
    elastic = _check_ranks(state, options, allow_length_change)
    for name, now in fingerprint(options).items():
        saved = state[name]
        if saved != now and not (elastic and name == "num_replicas"):
            raise ValueError(
                f"state was saved with {name}={saved}, this loader has {name}={now} (state "
                f"field {name!r}): the batches would not line up; resume with the same value"
            )
    _check_rng(state["rng"], options)
    _check_position(state, options)


def _check_rng(rng: dict, options: Options) -> None:
    """The RNG the state replays is this loader's kind (its generator, or torch's global
    one), and its state one that RNG takes."""
    generator = options.generator
    if (rng["kind"] == "generator") != (generator is not None):
        saved = "with a generator" if rng["kind"] == "generator" else "without a generator"
        now = "has one" if generator is not None else "has none"
        raise refuse(
            "rng.kind",
            f"is {rng['kind']!r}: the state was saved {saved}, this loader {now}; its order "
            "would come from another RNG",
        )
    scratch = torch.Generator(device=generator.device) if generator is not None else None
    try:
        raw = torch.frombuffer(bytearray(decode_rng_bytes(rng["state"])), dtype=torch.uint8)
        (scratch or torch.Generator()).set_state(raw.clone())
    except (RuntimeError, ValueError, TypeError) as exc:
        raise refuse("rng.state", f"is not a state of this loader's RNG ({exc})") from None


def _mid_epoch(state: dict) -> bool:
    """The state's epoch had begun: a batch was delivered."""
    return bool(state["next_batch"] or state["delivered_beyond"])


def _source_field(state: dict, in_workers: bool) -> str:
    """The field that holds a source's own state, as the error names it."""
    if "source_state" in state:
        return "source_state.per_worker" if in_workers else "source_state"
    return "_snapshot._worker_snapshots" if in_workers else "dataset_state"


def _owns(source: Any) -> list[Any]:
    """The own states (``{"dataset", "iterator"}`` or ``None``) in ``source``: one per
    worker iterating it, else one."""
    if source is None:
        return []
    if "per_worker" in source:
        return [worker["state"] for worker in source["per_worker"]]
    return [source]


def _holds(source: Any) -> bool:
    """``source`` (asyncloader's form) holds a state of the source's own."""
    return any(
        own is not None and (own["dataset"] is not None or own["iterator"] is not None)
        for own in _owns(source)
    )


def _check_source(state: dict, options: Options) -> None:
    """A state saved for a map-style source is not one for an iterable (its
    ``fetcher_state``), and a dataset state needs a dataset with ``load_state_dict``."""
    if "fetcher_state" in state and (state["fetcher_state"] is None) != options.kind.is_map:
        kind = "map-style" if state["fetcher_state"] is None else "iterable"
        raise refuse("fetcher_state", f"was saved for an {kind} source, this loader's is not")
    saved = taken(state)
    if callable(getattr(options.dataset, "load_state_dict", None)):
        return
    if any(own is not None and own["dataset"] is not None for own in _owns(saved)):
        raise refuse(
            _source_field(state, "per_worker" in saved),
            f"holds a dataset state, and {type(options.dataset).__qualname__} has no "
            "load_state_dict()",
        )


def _check_length(state: dict, options: Options, allowed: bool) -> None:
    """A map-style dataset of another length gives another order (unless the user allows
    it); a state without the length (version 4 and before) is not checked."""
    saved, now = state.get("dataset_len"), dataset_len(options)
    if saved is None or now is None or saved == now or allowed:
        return
    raise refuse(
        "dataset_len",
        f"is {saved}: the state was saved for a dataset of {saved} samples, this loader's has "
        f"{now}, so its order would differ; to resume anyway, "
        "load_state_dict(state, allow_length_change=True)",
    )


def _check_ranks(state: dict, options: Options, allow_length_change: bool = False) -> bool:
    """Checks a state of the loader's own rank sampler against this one's; True when both
    have one (then the world size may differ)."""
    saved, now = state.get("distributed"), ranks_state(options, ()).get("distributed")
    ranked = options.own_sampler is not None and state["version"] >= 3
    if ranked and (saved is None or "seed" not in saved):
        raise refuse("distributed", "is missing or not a rank sampler's: distributed=True")
    if saved is None or now is None:
        return False
    if options.own_sampler is None:  # an iterable source's
        if _source_moves(state, options):
            _check_in_order(state, saved["world_size"], now["world_size"])
        return False
    _check_order(state, now, allow_length_change)
    if saved["world_size"] != now["world_size"]:
        _check_in_order(state, saved["world_size"], now["world_size"])
    return True


def _check_order(state: dict, now: dict, allow_length_change: bool) -> None:
    """The rank sampler's global order is the saved one: same seed, shuffle and length (a
    new length only with ``allow_length_change``, see :func:`_may_change_length`)."""
    saved = state["distributed"]
    for name, what in (("dataset_len", "a dataset of"), ("seed", "seed"), ("shuffle", "shuffle=")):
        if saved[name] == now[name]:
            continue
        length = name == "dataset_len" and allow_length_change
        if length and _may_change_length(state, now):
            continue
        raise ValueError(
            f"state was saved for {what} {saved[name]}, this loader has {what} {now[name]} "
            f"(state field 'distributed.{name}'): its order would not be the one the state "
            "continues" + (_LENGTH_AT_BOUNDARY if length else "")
        )


_LENGTH_AT_BOUNDARY = (
    "; with distributed=True allow_length_change=True takes a state saved between epochs, "
    "or mid-epoch at the same world size and not resumed at another"
)


def _may_change_length(state: dict, now: dict) -> bool:
    """With the loader's own rank sampler a new length goes with a state between epochs, or
    one whose epoch was never cut at another world size and resumes at the same one."""
    saved = state["distributed"]
    same_world = saved["world_size"] == now["world_size"]
    return not saved["history"] and (same_world or not _mid_epoch(state))


def _check_in_order(state: dict, saved: int, now: int) -> None:
    if state.get("delivered_beyond"):
        raise ValueError(
            f"state was saved at world_size={saved} with batches delivered out of order "
            f"(state field 'delivered_beyond': {state['delivered_beyond']}); at "
            f"world_size={now} only an in-order position carries over: save with in_order=True"
        )


def _epoch_batches(state: dict, options: Options) -> int | None:
    """Batches in the state's epoch where the loader knows them exactly: a map-style source
    under torch's samplers or its own rank sampler (the epoch's remainder at the saved world
    size); else ``None``."""
    batch_sampler, sampler = options.batch_sampler, options.sampler
    exact = isinstance(sampler, _EXACT_SAMPLERS)
    if (
        not options.kind.is_map
        or not exact
        or type(batch_sampler) not in (BatchSampler, type(None))
    ):
        return None
    ranks = state.get("distributed") if options.own_sampler is not None else None
    if ranks is not None and "history" in ranks:
        cuts = [tuple(cut) for cut in ranks["history"]]
        samples = share(
            remainder_len(ranks["dataset_len"], cuts), ranks["world_size"], ranks["tail"]
        )
    else:
        samples = len(sampler)
    if batch_sampler is None:
        return samples
    size = batch_sampler.batch_size
    return samples // size if batch_sampler.drop_last else -(-samples // size)


def _check_position(state: dict, options: Options) -> None:
    """The position lies within the epoch: ``next_batch`` at most its length (equal: all
    received, the end not yet seen), each batch of ``delivered_beyond`` after it and inside;
    workers iterating the source delivered no more than ``next_batch`` between them."""
    start = state["next_batch"]
    total = _epoch_batches(state, options)
    if total is not None and start > total:
        raise refuse("next_batch", f"is {start}, past the epoch's {total} batches")
    _check_beyond(state["delivered_beyond"], start, total)
    saved = taken(state)
    if saved is None or "per_worker" not in saved:
        return
    delivered = sum(worker["delivered"] for worker in saved["per_worker"])
    if delivered > start:
        raise refuse(
            _source_field(state, True),
            f"has its workers deliver {delivered} batches, more than next_batch={start}",
        )


def _check_beyond(beyond: list[int], start: int, total: int | None) -> None:
    """Each batch delivered ahead lies after ``start`` and inside the epoch."""
    end = "the end" if total is None else str(total)
    for i, seq in enumerate(beyond):
        if seq <= start or (total is not None and seq >= total):
            raise refuse(
                f"delivered_beyond[{i}]", f"is {seq}: not between next_batch={start} and {end}"
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


def rebase(state: dict, options: Options, allow_length_change: bool = False) -> dict:
    """``state`` (checked) as this loader resumes it: a new dataset length taken in
    (``allow_length_change``), a source state that holds nothing put in this loader's
    placement, and at another world size (elastic resume, see
    :mod:`asyncloader._config.rank_sampler`) the batches every rank took made one more cut
    of the epoch, whose remainder this loader's ranks split. Never changes ``state``."""
    state = _placed_here(_with_length(state, options, allow_length_change), options)
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


def _with_length(state: dict, options: Options, allowed: bool) -> dict:
    """With ``allow_length_change``, the state records this loader's dataset length (a
    state saved from it then loads without the opt-in)."""
    now = dataset_len(options)
    if not allowed or now is None or state.get("dataset_len") in (None, now):
        return state
    state = {**state, "dataset_len": now}
    ranks, sampler = state.get("distributed"), options.own_sampler
    if ranks is not None and sampler is not None and "dataset_len" in ranks:
        state["distributed"] = {**ranks, "dataset_len": sampler.n}
    return state


def _placed_here(state: dict, options: Options) -> dict:
    """An iterable source's state that holds nothing (a fresh one, or of a stateless
    source), in this loader's placement: one per worker iterating it, else none."""
    saved = taken(state)
    if options.kind.is_map or _holds(saved) or _mid_epoch(state) or _fits(saved, options):
        return state
    source = fresh_state(options.num_workers) if options.worker_streams else None
    kept = {k: v for k, v in state.items() if k not in SOURCE_KEYS}
    return {**kept, **placed(source, options), "version": max(state["version"], 4)}


def _fits(saved: Any, options: Options) -> bool:
    """``saved`` (asyncloader's form) is in this loader's placement: one per worker when
    the workers iterate the source, else a single one (or none)."""
    if saved is None or "per_worker" not in saved:
        return not options.worker_streams
    return options.worker_streams and len(saved["per_worker"]) == options.num_workers


def _rebase_source(state: dict, options: Options) -> dict:
    """An iterable source's state saved at another world size: its streams' own states (one,
    or one per worker with ``fetch_in_workers``) become the one state with which each of
    this loader's streams, in this placement, continues the epoch (the source's
    ``elastic_state``). The batch count goes on: it numbers the epoch's steps."""
    streams = [(own or {}).get("dataset") for own in _owns(taken(state))]
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
        "version": max(state["version"], 4),  # the source's state in version 4's places
        "delivered_beyond": [],
        "distributed": {**state["distributed"], "world_size": world},
    }


def _check_placement(state: dict, options: Options) -> None:
    """An iterable source's own state means something else in the workers' iterations
    (``fetch_in_workers``, one per worker) than in a single one: a state that holds one, or
    a position mid-epoch, resumes in the placement and number of workers it was saved with.
    (A state holding none is put in this loader's placement by :func:`rebase`.)"""
    saved = taken(state)
    per_worker = saved.get("per_worker") if isinstance(saved, dict) else None
    in_workers = per_worker is not None
    mid_epoch = bool(state["next_batch"]) or bool(state["delivered_beyond"])
    if options.kind.is_map or not (mid_epoch or _holds(saved)):
        return
    if in_workers != options.worker_streams:
        raise refuse(
            _source_field(state, in_workers),
            f"was saved with fetch_in_workers={in_workers}, this loader has "
            f"fetch_in_workers={options.worker_streams}: an iterable source's state does not "
            "carry over between the two placements; resume with the same value",
        )
    saved_workers = len(per_worker) if per_worker is not None else options.num_workers
    if saved_workers != options.num_workers:
        raise refuse(
            _source_field(state, True),
            f"was saved with num_workers={saved_workers} iterating the source, this loader "
            f"has num_workers={options.num_workers}: each worker's own iteration (and its "
            "dataset's state) continues, so resume with the same num_workers",
        )


def resume_point(state: dict) -> Resume:
    return Resume(
        start=int(state["next_batch"]),
        skip=frozenset(int(s) for s in state["delivered_beyond"]),
        source_state=taken(state),
    )
