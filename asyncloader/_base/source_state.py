"""A source's own state, read through torchdata's protocol (``state_dict()`` and
``load_state_dict()`` on the dataset and on the iterator its ``__iter__`` returned).

Read in the training process and inside workers alike, so it sits at the bottom of the package.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


def is_stateful(source: Any) -> bool:
    """The source can report and restore its position itself."""
    return callable(getattr(source, "state_dict", None)) and callable(
        getattr(source, "load_state_dict", None)
    )


def source_state(dataset: Any, iterator: Any = None) -> dict[str, Any] | None:
    """Copies of the own states of ``dataset`` and of its ``iterator``, or ``None`` when
    neither keeps one.

    A dataset that is its own iterator (``__iter__`` returns ``self``) has its state saved
    once, as the iterator's: restored after ``iter()``, which may reset it. Copies, because
    the source is pulled ahead of the consumer: a ``state_dict()`` returning live objects
    would otherwise change under a checkpoint taken earlier.
    """
    own = is_stateful(dataset) and iterator is not dataset
    iterates = iterator is not None and is_stateful(iterator)
    state = {
        "dataset": dataset.state_dict() if own else None,
        "iterator": iterator.state_dict() if iterates else None,
    }
    if state["dataset"] is None and state["iterator"] is None:
        return None
    return {key: copied(value) for key, value in state.items()}


_ATOMIC = frozenset({int, float, str, bool, type(None), bytes})


def copied(value: Any) -> Any:
    """A deep copy of ``value``, as ``copy.deepcopy`` makes it, faster for the JSON-like
    values states are: dicts and lists are rebuilt, a list or tuple of numbers and strings is
    copied in one C call (``deepcopy`` visits each of its items: 1.7 ms for the 4,000 ints of
    a ``Packed`` carry, taken after every batch), anything else goes to ``deepcopy``.
    Unlike ``deepcopy``, a list referenced twice is copied twice (states do not share)."""
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is dict:
        return {k: copied(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        if set(map(type, value)) <= _ATOMIC:
            return value.copy() if kind is list else value
        items = [copied(v) for v in value]
        return items if kind is list else tuple(items)
    return copy.deepcopy(value)


def restore_dataset(
    dataset: Any, saved: dict[str, Any], tell_epoch: Callable[[], None] | None, mid_epoch: bool
) -> None:
    """The order of opening a source, in the training process and in workers alike, first
    part: the epoch (``tell_epoch``, None when not told) and the dataset's own state.

    ``set_epoch`` may reset a source's position: mid-epoch the loaded position wins (the epoch
    is told first), at an epoch's start the epoch does (told after the carried-over state).
    The dataset's state goes in before anything draws (torchdata's order): it may hold RNG
    states. Then :func:`open_iterator`.
    """
    if tell_epoch is not None and mid_epoch:
        tell_epoch()
    if saved.get("dataset") is not None:
        dataset.load_state_dict(saved["dataset"])
    if tell_epoch is not None and not mid_epoch:
        tell_epoch()


def open_iterator(dataset: Any, saved: dict[str, Any], is_async: bool) -> Any:
    """The order of opening a source, second part: ``iter()`` (or ``aiter()``), which may
    reset a position, then the iterator's own state."""
    iterator = aiter(dataset) if is_async else iter(dataset)
    if saved.get("iterator") is not None:
        iterator.load_state_dict(saved["iterator"])
    return iterator


def counts_between(dataset: Any, before: Any, after: Any) -> dict[str, int]:
    """Samples each part of ``dataset`` gave between two of its own states (as
    :func:`source_state` reads them), where the dataset can say (``counts_at(state_dict)``,
    as ``asyncloader.sources.Mix``: per-source counts at the position a state records);
    ``{}`` otherwise."""
    counts_at = getattr(dataset, "counts_at", None)
    if not callable(counts_at) or not before or not after:
        return {}
    if before.get("dataset") is None or after.get("dataset") is None:
        return {}
    start, end = counts_at(before["dataset"]), counts_at(after["dataset"])
    return {name: int(n) - int(start.get(name, 0)) for name, n in end.items()}
