"""A loader's checkpoint, saved and loaded: what ``AsyncLoader.state_dict()`` returns and
what ``load_state_dict()`` keeps (the public methods' docstrings say what the state holds).

The state is what the consumer has received: mid-epoch, the epoch's progress record
(:class:`~asyncloader._checkpoint.progress.Progress`); between epochs, the next epoch, the RNG
state its shuffle will draw from and the dataset's own state.
"""

from __future__ import annotations

import copy
from typing import Any

from asyncloader._base import source_state
from asyncloader._checkpoint import (
    STATE_VERSION,
    check_state,
    dataset_len,
    encode_rng,
    fingerprint,
    next_epoch_state,
    placed,
    ranks_state,
    rebase,
)
from asyncloader._config import Options
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.epoch_start import capture_rng


def saved_state(
    options: Options, number: int, last: Epoch | None, dataset_keeps_state: bool
) -> dict[str, Any]:
    """The state of a loader at epoch ``number`` whose current (or last) epoch is ``last``.

    Args:
        options: The loader's options.
        number: The loader's epoch number (``-1`` before the first).
        last: The current (or last) epoch, if any.
        dataset_keeps_state: Between epochs the dataset's own state is saved (see
            :func:`next_source_state`).
    """
    if last is not None and not last.progress.finished:
        last.settle_source()
        rng, cuts = last.start_info.rng, last.start_info.cuts
        position = {"epoch": number, "rng": encode_rng(rng), **last.progress.checkpoint()}
    else:
        kind, drawn_from = capture_rng(options.generator)
        cuts = ()
        # The next epoch has not drawn yet: torch's global state is the one it will draw
        # from, set for good on resume (mid-epoch it is replayed for the start only).
        position = {
            "epoch": number + 1,
            "rng": encode_rng(("next_global" if kind == "global" else kind, drawn_from)),
            "next_batch": 0,
            "delivered_beyond": [],
            "source_state": next_source_state(options, last, dataset_keeps_state),
        }
    ranks = ranks_state(options, cuts)
    own = placed(position.pop("source_state"), options)
    length = dataset_len(options)
    head = {"version": STATE_VERSION, **fingerprint(options), "dataset_len": length}
    return {**head, **position, **own, **ranks}


def next_source_state(options: Options, last: Epoch | None, dataset_keeps_state: bool) -> Any:
    """The source's own state for the next epoch: the dataset's (the workers' copies',
    when each iterates its own), or ``None`` when it keeps none (``dataset_keeps_state``
    false: an iterable that is its own iterator, reset by its ``__iter__``)."""
    if options.worker_streams:
        state = last.progress.checkpoint()["source_state"] if last else None
        return next_epoch_state(state, options.num_workers)
    return source_state(options.dataset) if dataset_keeps_state else None


def loaded_state(
    state: dict[str, Any], options: Options, allow_length_change: bool
) -> dict[str, Any]:
    """``state`` checked as a whole and made the resume point of the next epoch (a copy: the
    caller may change its dict afterwards).

    Raises:
        TypeError: ``state`` is not a dict, or ``allow_length_change`` not a bool.
        ValueError: ``state`` does not fit ``options`` (see ``AsyncLoader.load_state_dict``).
    """
    if not isinstance(allow_length_change, bool):
        kind = type(allow_length_change).__qualname__
        raise TypeError(f"allow_length_change must be a bool, got {kind}")
    check_state(state, options, allow_length_change)
    return copy.deepcopy(rebase(state, options, allow_length_change))
