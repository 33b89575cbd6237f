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


def tensors_of(data: Any) -> list[torch.Tensor]:
    """Every tensor reachable through the containers :func:`map_structure` understands."""
    found: list[torch.Tensor] = []

    def collect(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            found.append(x)
            return x
        return DESCEND

    map_structure(data, collect)
    return found


def nbytes(batch: Any) -> int:
    """Bytes held by the tensors and numpy arrays in ``batch`` (any nesting)."""
    total = 0

    def count(x: Any) -> Any:
        nonlocal total
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()  # nbytes, which sparse tensors lack
            return x
        if isinstance(x, np.ndarray):
            total += x.nbytes
            return x
        return DESCEND

    map_structure(batch, count)
    return total
