"""The sources of a :class:`~asyncloader.sources.Mix`: the checks of its arguments (each error
names the argument) and where a Mix may be iterated; what each source is, its share on this
rank, and how an iterable one is opened where a saved position left it.

An iterable source is opened as the loader opens one (``asyncloader._base.source_state``):
its epoch told first (``set_epoch``, where it has it), then its own state loaded (torchdata's
``state_dict`` protocol), then ``iter()``/``aiter()`` and the iterator's state. What its own
state does not cover (a source without one, or samples drawn on positions since it was
saved) is read and dropped.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from asyncloader._base import (
    SourceKind,
    get_worker_info,
    has_getitems,
    open_iterator,
    restore_dataset,
    source_kind,
    supplies_sampler,
)
from asyncloader.sources._mix.draws import STOPS, Layout, MemberCut, Order, rank_order, share_len


def any_async(sources: Any) -> bool:
    """Some source is async (checked by ``__init__``: False where ``sources`` is bad)."""
    return any(m.is_async for m in _members(sources))


def all_sync_map(sources: Any) -> bool:
    """Every source is sync map-style (and ``sources`` good enough to say)."""
    members = _members(sources)
    return bool(members) and all(m.is_map and not m.is_async for m in members)


def _members(sources: Any) -> list[Member]:
    if not isinstance(sources, Mapping):
        return []
    try:
        return [Member(str(n), s, 0, False) for n, s in sources.items()]
    except TypeError:
        return []  # __init__ says what is wrong


def refuse_copies() -> None:
    """Raises ValueError where a Mix would be iterated in copies, each drawing its own mix:
    an asyncloader worker (``fetch_in_workers=True`` with an iterable or async source), or
    one of several DataLoader workers. (A Mix of sync map-style sources only is read as a
    map-style dataset: its sampler draws, the workers read.)"""
    if get_worker_info() is not None:
        raise ValueError(
            "a Mix with an iterable or async source is iterated in one place, where its "
            "draws are made: with fetch_in_workers=True every worker would iterate its own "
            "copy and draw its own mix. Use fetch_in_workers=False: the Mix is then iterated "
            "in the training process (async map-style sources `concurrency` at a time) and "
            "transform and collate still run in the workers (a Mix of sync map-style "
            "sources only works with fetch_in_workers=True)"
        )
    info = torch.utils.data.get_worker_info()
    if info is not None and info.num_workers > 1:
        raise ValueError(
            f"a Mix is iterated in one place: DataLoader's {info.num_workers} workers would "
            "each iterate a copy and draw its own mix; use num_workers <= 1, or AsyncLoader"
        )


def check_sources(sources: Any) -> list[str]:
    if not isinstance(sources, Mapping):
        raise TypeError(f"sources must be a dict of name -> source, got {type(sources).__name__}")
    if not sources:
        raise ValueError("sources must name at least one source")
    bad = [n for n in sources if not isinstance(n, str)]
    if bad:
        raise TypeError(f"sources' names must be str, got {bad[0]!r}")
    return sorted(sources)


def check_weights(weights: Any, names: Sequence[str], field: str) -> list[float]:
    """``weights`` as floats in ``names``' order.

    Raises:
        TypeError: Not a dict, or a weight is not a real number.
        ValueError: A name unknown or missing, a weight negative or not finite, all 0.
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"{field} must be a dict of name -> weight, got {type(weights).__name__}")
    unknown = sorted(set(weights) - set(names), key=str)
    if unknown:
        raise ValueError(f"{field} names {unknown[0]!r}, which is not in sources {list(names)}")
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(f"{field} lacks {missing[0]!r}: every source needs a weight")
    out = [weight(f"{field}[{name!r}]", weights[name]) for name in names]
    if not any(out):
        raise ValueError(f"{field} are all 0: at least one source must be drawn")
    return out


def weight(field: str, w: Any) -> float:
    if isinstance(w, bool) or not isinstance(w, numbers.Real):
        raise TypeError(f"{field} must be a number, got {type(w).__name__}")
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"{field} must be finite and >= 0, got {w!r}")
    return float(w)


def check_int(field: str, value: Any, least: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{field} must be an int, got {type(value).__name__}")
    if least is not None and value < least:
        raise ValueError(f"{field} must be >= {least}, got {value}")
    return int(value)


def check_stop(stop: Any, samples_per_epoch: Any) -> None:
    """Raises ValueError for an unknown ``stop`` or a bad ``samples_per_epoch``."""
    if stop not in STOPS:
        raise ValueError(f"stop must be one of {STOPS}, got {stop!r}")
    if samples_per_epoch is None:
        if stop == "never":
            raise ValueError(
                "stop='never' needs samples_per_epoch: the sources never run out, so the "
                "epoch's length (draws per rank) must be given"
            )
        return
    check_int("samples_per_epoch", samples_per_epoch, 1)


class Member:
    """One source of a Mix.

    Args:
        name: Its key in ``sources``.
        source: The source: map-style (sync or async ``__getitem__`` and ``len``) or iterable
            (sync or async).
        seed, shuffle: The Mix's: a map-style source's epoch order is seeded from (seed,
            name, epoch).

    Raises:
        TypeError: ``source`` is neither map-style nor iterable (named ``sources[name]``).
    """

    def __init__(self, name: str, source: Any, seed: int, shuffle: bool) -> None:
        try:
            kind = source_kind(source)
            if supplies_sampler(source):  # a Mix in a Mix: iterated, in its own order
                kind = SourceKind.ITERABLE
        except TypeError:
            raise TypeError(
                f"sources[{name!r}] must be map-style (__getitem__ and __len__, sync or "
                f"async) or iterable (__iter__ or __aiter__), got {type(source).__qualname__}"
            ) from None
        if kind.is_map and not callable(getattr(source, "__len__", None)):
            raise TypeError(f"sources[{name!r}] is map-style without __len__: it needs one")
        self.name, self.source, self.kind = name, source, kind
        self.is_map = kind.is_map
        self.is_async = kind in (SourceKind.ASYNC_MAP, SourceKind.ASYNC_ITERABLE)
        #: A sync map-style source's own ``__getitems__`` (a batch in one call), or None.
        self.getitems = (
            source.__getitems__ if kind is SourceKind.MAP and has_getitems(source) else None
        )
        self._seed, self._shuffle = seed, shuffle
        self._n: int | None = None
        self._orders: list[tuple[tuple[int, int, Layout], Order]] = []

    def length(self) -> int:
        """``len(source)`` (map-style), asked once."""
        if self._n is None:
            self._n = len(self.source)
        return self._n

    def order(self, epoch: int, cuts: Sequence[MemberCut], layout: Layout) -> Order:
        """This rank's order of the source's epoch ``epoch`` cut by ``cuts`` (the last two
        kept: a plan running ahead may be one epoch further than what was handed out)."""
        key = (epoch, len(cuts), layout)
        for held, order in self._orders:
            if held == key:
                return order
        order = Order(rank_order(self.length(), (self._seed, self.name, epoch), self._shuffle,
                                 cuts, layout))  # fmt: skip
        self._orders = [*self._orders[-1:], (key, order)]
        return order

    def __getstate__(self) -> dict[str, Any]:
        """A copy (a worker's) keeps no orders: they are made again where they are needed."""
        return {**self.__dict__, "_orders": []}

    def tell_epoch(self, epoch: int) -> Callable[[], None] | None:
        """What tells an iterable source its epoch, or None when it has no ``set_epoch``."""
        set_epoch = getattr(self.source, "set_epoch", None)
        return (lambda: set_epoch(epoch)) if callable(set_epoch) else None


def share_of(
    members: Sequence[Member], layout: Layout
) -> Callable[[int, int, list[MemberCut]], Any]:
    """``share(i, epoch, cuts)``: samples map-style source ``i`` gives this rank in its epoch
    cut by ``cuts`` (None for an iterable source), remembered per (source, epoch, cuts)."""
    known: dict[tuple[int, int, int], int] = {}
    is_map = [m.is_map for m in members]

    def share(i: int, epoch: int, cuts: list[MemberCut]) -> int | None:
        if not is_map[i]:
            return None
        key = (i, epoch, len(cuts))
        n = known.get(key)
        if n is None:
            n = known[key] = share_len(members[i].length(), cuts, layout)
        return n

    return share


def open_sync(member: Member, epoch: int, own: dict[str, Any] | None) -> Iterator[Any]:
    """A sync iterable source's iterator at its epoch ``epoch``, where ``own`` (its saved
    state, or None: its start) left it."""
    restore_dataset(member.source, own or {}, member.tell_epoch(epoch), True)
    iterator: Iterator[Any] = open_iterator(member.source, own or {}, False)
    return iterator


def open_async(member: Member, epoch: int, own: dict[str, Any] | None) -> AsyncIterator[Any]:
    """As :func:`open_sync`, for an async iterable source."""
    restore_dataset(member.source, own or {}, member.tell_epoch(epoch), True)
    iterator: AsyncIterator[Any] = open_iterator(member.source, own or {}, True)
    return iterator


def skip_sync(iterator: Iterator[Any], n: int) -> int:
    """Reads and drops up to ``n`` items; how many there were."""
    for dropped in range(n):
        try:
            next(iterator)
        except StopIteration:
            return dropped
    return n


async def skip_async(iterator: AsyncIterator[Any], n: int) -> int:
    """As :func:`skip_sync`, for an async iterator."""
    for dropped in range(n):
        try:
            await anext(iterator)
        except StopAsyncIteration:
            return dropped
    return n


def close_sync(member: Member, iterator: Any) -> None:
    """Closes an iterator the source's ``__iter__`` made (never the source itself, whose
    ``close`` may mean more)."""
    close = getattr(iterator, "close", None)
    if iterator is not member.source and callable(close):
        close()


async def close_async(member: Member, iterator: Any) -> None:
    """As :func:`close_sync`, with ``aclose``."""
    close = getattr(iterator, "aclose", None)
    if iterator is not member.source and callable(close):
        with contextlib.suppress(RuntimeError):  # an async generator already running
            await close()
