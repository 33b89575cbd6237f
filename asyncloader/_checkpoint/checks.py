"""Checks of a checkpoint state against the loader that loads it, before any of it is used:
that it continues this loader's order (batch size, world size, seed, shuffle, RNG, dataset
length), that a source's own state fits this source and its placement, and that the position
lies within the epoch. Its shape is checked first (:mod:`asyncloader._checkpoint.shape`).
"""

from __future__ import annotations

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

from asyncloader._base import share
from asyncloader._checkpoint.layout import taken
from asyncloader._checkpoint.record import (
    dataset_len,
    fingerprint,
    holds,
    mid_epoch,
    owns,
    ranks_state,
    source_moves,
)
from asyncloader._checkpoint.shape import check_shape, decode_rng_bytes, refuse
from asyncloader._config import Options, RankSampler, remainder_len

#: Samplers whose ``len()`` is exactly what they yield: a position past it is refused.
_EXACT_SAMPLERS = (
    SequentialSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    DistributedSampler,
    RankSampler,
)


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
    if not source_moves(state, options):
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


def _check_rng(rng: dict[str, Any], options: Options) -> None:
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


def _source_field(state: dict[str, Any], in_workers: bool) -> str:
    """The field that holds a source's own state, as the error names it."""
    if "source_state" in state:
        return "source_state.per_worker" if in_workers else "source_state"
    return "_snapshot._worker_snapshots" if in_workers else "dataset_state"


def _check_source(state: dict[str, Any], options: Options) -> None:
    """A state saved for a map-style source is not one for an iterable (its
    ``fetcher_state``), and a dataset state needs a dataset with ``load_state_dict``."""
    if "fetcher_state" in state and (state["fetcher_state"] is None) != options.kind.is_map:
        kind = "map-style" if state["fetcher_state"] is None else "iterable"
        raise refuse("fetcher_state", f"was saved for an {kind} source, this loader's is not")
    saved = taken(state)
    if callable(getattr(options.dataset, "load_state_dict", None)):
        return
    if any(own is not None and own["dataset"] is not None for own in owns(saved)):
        raise refuse(
            _source_field(state, "per_worker" in saved),
            f"holds a dataset state, and {type(options.dataset).__qualname__} has no "
            "load_state_dict()",
        )


def _check_length(state: dict[str, Any], options: Options, allowed: bool) -> None:
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


def _check_ranks(
    state: dict[str, Any], options: Options, allow_length_change: bool = False
) -> bool:
    """Checks a state of the loader's own rank sampler against this one's; True when both
    have one (then the world size may differ)."""
    saved, now = state.get("distributed"), ranks_state(options, ()).get("distributed")
    ranked = options.own_sampler is not None and state["version"] >= 3
    if ranked and (saved is None or "seed" not in saved):
        raise refuse("distributed", "is missing or not a rank sampler's: distributed=True")
    if saved is None or now is None:
        return False
    if options.own_sampler is None:  # an iterable source's
        if source_moves(state, options):
            _check_in_order(state, saved["world_size"], now["world_size"])
        return False
    _check_order(state, now, allow_length_change)
    if saved["world_size"] != now["world_size"]:
        _check_in_order(state, saved["world_size"], now["world_size"])
    return True


def _check_order(state: dict[str, Any], now: dict[str, Any], allow_length_change: bool) -> None:
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


def _may_change_length(state: dict[str, Any], now: dict[str, Any]) -> bool:
    """With the loader's own rank sampler a new length goes with a state between epochs, or
    one whose epoch was never cut at another world size and resumes at the same one."""
    saved = state["distributed"]
    same_world = saved["world_size"] == now["world_size"]
    return not saved["history"] and (same_world or not mid_epoch(state))


def _check_in_order(state: dict[str, Any], saved: int, now: int) -> None:
    if state.get("delivered_beyond"):
        raise ValueError(
            f"state was saved at world_size={saved} with batches delivered out of order "
            f"(state field 'delivered_beyond': {state['delivered_beyond']}); at "
            f"world_size={now} only an in-order position carries over: save with in_order=True"
        )


def _epoch_batches(state: dict[str, Any], options: Options) -> int | None:
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
    size: int = batch_sampler.batch_size
    return samples // size if batch_sampler.drop_last else -(-samples // size)


def _check_position(state: dict[str, Any], options: Options) -> None:
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


def _check_placement(state: dict[str, Any], options: Options) -> None:
    """An iterable source's own state means something else in the workers' iterations
    (``fetch_in_workers``, one per worker) than in a single one: a state that holds one, or
    a position mid-epoch, resumes in the placement and number of workers it was saved with.
    (A state holding none is put in this loader's placement by
    :func:`~asyncloader._checkpoint.rebasing.rebase`.)"""
    saved = taken(state)
    per_worker = saved.get("per_worker") if isinstance(saved, dict) else None
    in_workers = per_worker is not None
    mid_epoch = bool(state["next_batch"]) or bool(state["delivered_beyond"])
    if options.kind.is_map or not (mid_epoch or holds(saved)):
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
