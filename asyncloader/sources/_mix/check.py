"""The checks of a :class:`~asyncloader.sources.Mix`'s arguments (each error names the
argument), and where a Mix may be iterated."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from asyncloader._base import get_worker_info
from asyncloader.sources._mix.draw import STOPS
from asyncloader.sources._mix.sources import Member


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
