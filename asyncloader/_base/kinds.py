"""Tells which of the four kinds of source a dataset is, and the protocols users implement."""

from __future__ import annotations

import enum
import inspect
from collections.abc import AsyncIterable, Awaitable, Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

from torch.utils.data import IterableDataset

T_co = TypeVar("T_co", covariant=True)


class MapStyle(Protocol[T_co]):
    """A map-style source: ``source[index]`` is a sample, or an awaitable of one (the type
    of ``AsyncLoader``'s map-style ``dataset``)."""

    def __getitem__(self, index: Any, /) -> T_co | Awaitable[T_co]: ...


@runtime_checkable
class MapSource(Protocol):
    """A map-style source: ``len`` and a sync ``__getitem__`` (any torch ``Dataset``)."""

    def __getitem__(self, index: Any) -> Any: ...

    def __len__(self) -> int: ...


@runtime_checkable
class AsyncMapSource(Protocol):
    """A map-style source whose ``__getitem__`` is a coroutine function, awaited on the loop."""

    async def __getitem__(self, index: Any) -> Any: ...

    def __len__(self) -> int: ...


class SourceKind(enum.Enum):
    """Where and how samples are pulled from a source."""

    MAP = "map"
    ASYNC_MAP = "async map"
    ITERABLE = "iterable"
    ASYNC_ITERABLE = "async iterable"

    @property
    def is_map(self) -> bool:
        return self in (SourceKind.MAP, SourceKind.ASYNC_MAP)


def source_kind(dataset: Any) -> SourceKind:
    """Classifies ``dataset``.

    Raises:
        TypeError: ``dataset`` is neither indexable nor iterable.
    """
    cls = type(dataset)
    if isinstance(dataset, AsyncIterable):
        return SourceKind.ASYNC_ITERABLE
    if isinstance(dataset, IterableDataset):
        return SourceKind.ITERABLE
    getitem = getattr(cls, "__getitem__", None)
    if getitem is not None:
        if inspect.iscoroutinefunction(getitem):
            return SourceKind.ASYNC_MAP
        return SourceKind.MAP
    if isinstance(dataset, Iterable):
        return SourceKind.ITERABLE
    raise TypeError(
        f"dataset must be map-style (__getitem__, sync or async) or iterable (__iter__ or "
        f"__aiter__), got {cls.__qualname__}"
    )


def supplies_sampler(dataset: Any) -> bool:
    """``dataset`` orders itself: a map-style dataset with a ``loader_sampler()`` method (as
    ``asyncloader.sources.Mix`` of map-style sources), whose sampler the loader iterates
    instead of building one from ``shuffle`` and ``distributed``. Its keys are whatever its
    ``__getitem__`` takes; the sampler is already this rank's share."""
    if isinstance(dataset, (IterableDataset, AsyncIterable)):
        return False
    indexable = getattr(type(dataset), "__getitem__", None) is not None
    return indexable and callable(getattr(dataset, "loader_sampler", None))


def has_getitems(dataset: Any) -> bool:
    """DataLoader's test: ``dataset`` has a ``__getitems__`` that is not ``None``."""
    return bool(getattr(dataset, "__getitems__", None))
