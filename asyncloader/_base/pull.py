"""Pulling items from an iterable source, a few at a time: in the training process's batch
numbering and in a worker iterating its own copy alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from asyncloader._base.row_block import TAKE, Samples
from asyncloader._base.source_state import source_state


def sync_stream(dataset: Any, iterator: Iterator[Any]) -> Iterator[Any]:
    """What to pull a sync iterable's items from: ``islice(x)`` calls ``iter(x)``, harmless
    for an iterator, a restart for a dataset that is its own iterator, pulled through
    ``__next__`` instead (a generator step per item, ~70 ns)."""
    return through_next(iterator) if iterator is dataset else iterator


def take_sync(
    dataset: Any, iterator: Any, stream: Iterator[Any], size: int, stateful: bool = True
) -> tuple[list[Any], Any]:
    """Up to ``size`` items from ``stream`` (see :func:`sync_stream`), and then the source's
    own state (when ``stateful``; ``None`` when it keeps none)."""
    items = list(itertools.islice(stream, size))
    return items, source_state(dataset, iterator) if stateful else None


def through_next(iterator: Iterator[Any]) -> Iterator[Any]:
    """``iterator``'s items, pulled with its ``__next__`` (never ``iter()``)."""
    pull = iterator.__next__
    while True:
        try:
            yield pull()
        except StopIteration:
            return


async def take_async(ait: Any, size: int) -> Samples:
    """Up to ``size`` items of the async iterator ``ait`` (fewer only at its end): in one
    call where it offers the block protocol (:mod:`asyncloader._base.row_block`)."""
    take = getattr(ait, TAKE, None)
    if take is not None:
        block: Samples = await take(size)
        return block
    samples = []
    for _ in range(size):
        try:
            samples.append(await anext(ait))
        except StopAsyncIteration:
            break
    return samples
