"""A source's own state, read through torchdata's protocol (``state_dict()`` and
``load_state_dict()`` on the dataset and on the iterator its ``__iter__`` returned).

Read in the training process and inside workers alike, so it sits at the bottom of the package.
"""

from __future__ import annotations

import copy
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
    return copy.deepcopy(state)
