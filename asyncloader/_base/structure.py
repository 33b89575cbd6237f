"""Walks nested batches: dicts, lists, tuples, namedtuples and dataclasses, rebuilt around leaves.

The same traversal serves the worker (tensors and arrays into shared memory), the consumer
side (arrays back out of it) and the device thread (pin, copy, record_stream).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

#: Returned by a leaf function to say "not a leaf: recurse into it if it is a container".
DESCEND: Any = object()


def map_structure(data: Any, leaf: Callable[[Any], Any]) -> Any:
    """Returns ``data`` with every leaf replaced by ``leaf(x)``, container types kept.

    ``leaf`` is offered every node first (but plain lists and dicts, walked at once, and values
    of exactly a scalar type, kept); where it returns :data:`DESCEND`, dicts, lists,
    tuples, namedtuples and dataclass instances are rebuilt from their walked parts, and any
    other object is kept as it is.
    Nothing it makes outlives the call: no reference cycle keeps ``leaf`` (and whatever its
    closure holds, a batch's tensors) alive until the garbage collector's next pass.
    """
    return _walk(data, leaf)


#: Values of exactly these types are kept as they are, not offered to ``leaf``: no leaf
#: function replaces a plain scalar, and a batch of rows (a token list per row) holds many.
_SCALARS = frozenset({int, float, bool, str, bytes, complex, type(None)})


def _walk(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """:func:`map_structure`'s recursion: a module function, not a closure that calls itself
    (which would be a reference cycle through its own cell)."""
    kind = type(x)
    if kind in _SCALARS:
        return x
    if kind is list:  # the common containers first, their scalars without a call each
        if _SCALARS.issuperset(map(type, x)):  # a row's tokens: one C-level check
            return x.copy()
        return [v if type(v) in _SCALARS else _walk(v, leaf) for v in x]
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _walk(v, leaf) for k, v in x.items()}
    out = leaf(x)
    return _rebuild(x, leaf) if out is DESCEND else out


def _rebuild(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """``x`` rebuilt from its walked parts when it is a container :func:`map_structure`
    knows, else ``x`` itself."""
    if isinstance(x, str | bytes) or x is None:
        return x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        record = copy.copy(x)
        for field in dataclasses.fields(x):
            object.__setattr__(record, field.name, _walk(getattr(x, field.name), leaf))
        return record
    if isinstance(x, Mapping):
        items = {k: _walk(v, leaf) for k, v in x.items()}
        try:
            mapping = copy.copy(x)
            mapping.update(items)  # type: ignore[attr-defined]
            return mapping
        except (TypeError, AttributeError):
            return items
    if isinstance(x, tuple):
        if hasattr(x, "_fields"):
            return type(x)(*(_walk(v, leaf) for v in x))
        return tuple(_walk(v, leaf) for v in x)
    if isinstance(x, list):
        return [_walk(v, leaf) for v in x]
    return x


def arrays_of(data: Any) -> list[torch.Tensor | np.ndarray]:
    """Every tensor and numpy array reachable through the containers :func:`map_structure`
    understands, in its order. Only reads: no container is rebuilt, and a list or a dict of
    plain scalars (a row's tokens) is passed over in one C-level check."""
    found: list[torch.Tensor | np.ndarray] = []
    _scan(data, found)
    return found


def _scan(x: Any, found: list[torch.Tensor | np.ndarray]) -> None:
    kind = type(x)
    if kind in _SCALARS:
        return
    if kind is list or kind is dict:
        parts = x if kind is list else x.values()
        if not _SCALARS.issuperset(map(type, parts)):
            for v in parts:
                _scan(v, found)
        return
    if isinstance(x, torch.Tensor | np.ndarray):
        found.append(x)
    elif not isinstance(x, str | bytes):
        for v in _children(x):
            _scan(v, found)


def _children(x: Any) -> list[Any]:
    """The parts :func:`_rebuild` would walk, or none for an object it keeps whole."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [getattr(x, field.name) for field in dataclasses.fields(x)]
    if isinstance(x, Mapping):
        return list(x.values())
    if isinstance(x, tuple | list):
        return list(x)
    return []


def tensors_of(data: Any) -> list[torch.Tensor]:
    """Every tensor reachable through the containers :func:`map_structure` understands."""
    return [x for x in arrays_of(data) if isinstance(x, torch.Tensor)]


def nbytes(batch: Any) -> int:
    """Bytes held by the tensors and numpy arrays in ``batch`` (any nesting)."""
    return sum(map(array_bytes, arrays_of(batch)))


def array_bytes(x: torch.Tensor | np.ndarray) -> int:
    """Bytes of one tensor (``numel * element_size``: sparse tensors lack ``nbytes``) or array."""
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else x.nbytes
