"""A checked checkpoint state as this loader resumes it: a new dataset length taken in, a
source state that holds nothing put in this loader's placement, and at another world size the
position made one more cut of the epoch (the loader's own rank sampler) or the source's own
streams merged (an iterable source's ``elastic_state``).
"""

from __future__ import annotations

import copy
from typing import Any

from asyncloader._base import share
from asyncloader._checkpoint.layout import SOURCE_KEYS, placed, taken
from asyncloader._checkpoint.record import (
    dataset_len,
    fresh_state,
    holds,
    mid_epoch,
    owns,
    source_moves,
    world_size,
)
from asyncloader._config import Options, remainder_len


def rebase(
    state: dict[str, Any], options: Options, allow_length_change: bool = False
) -> dict[str, Any]:
    """``state`` (checked) as this loader resumes it: a new dataset length taken in
    (``allow_length_change``), a source state that holds nothing put in this loader's
    placement, and at another world size (elastic resume, see
    :mod:`asyncloader._config.rank_sampler`) the batches every rank took made one more cut
    of the epoch, whose remainder this loader's ranks split. Never changes ``state``."""
    state = _placed_here(_with_length(state, options, allow_length_change), options)
    if source_moves(state, options):
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


def _with_length(state: dict[str, Any], options: Options, allowed: bool) -> dict[str, Any]:
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


def _placed_here(state: dict[str, Any], options: Options) -> dict[str, Any]:
    """An iterable source's state that holds nothing (a fresh one, or of a stateless
    source), in this loader's placement: one per worker iterating it, else none."""
    saved = taken(state)
    if options.kind.is_map or holds(saved) or mid_epoch(state) or _fits(saved, options):
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


def _rebase_source(state: dict[str, Any], options: Options) -> dict[str, Any]:
    """An iterable source's state saved at another world size: its streams' own states (one,
    or one per worker with ``fetch_in_workers``) become the one state with which each of
    this loader's streams, in this placement, continues the epoch (the source's
    ``elastic_state``). The batch count goes on: it numbers the epoch's steps."""
    streams = [(own or {}).get("dataset") for own in owns(taken(state))]
    kept = None
    if any(s is not None for s in streams):
        kept = {"dataset": options.dataset.elastic_state(streams), "iterator": None}
    source: Any = kept
    if options.worker_streams:
        source = fresh_state(options.num_workers)
        for worker in source["per_worker"]:
            worker["state"] = copy.deepcopy(kept)
    world = world_size(options)
    kept_keys = {k: v for k, v in state.items() if k not in SOURCE_KEYS}
    return {
        **kept_keys,
        **placed(source, options),
        "version": max(state["version"], 4),  # the source's state in version 4's places
        "delivered_beyond": [],
        "distributed": {**state["distributed"], "world_size": world},
    }
