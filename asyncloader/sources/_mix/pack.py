"""A :class:`~asyncloader.sources.Mix`'s saved state: packed and unpacked, and checked.

The state (``state_dict()``, JSON-friendly, ``"mix": 1``) is packed, because the loader
copies it before every batch: ``"base"``, a place (see :mod:`.state`) without its own
states, encoded as one JSON string (made when the iteration began, or last met an iterable
source's end), ``"drawn"``, the draws made since the epoch began (those after the base's are
replayed on positions when the state is loaded), the iterable sources' own states
(``"own"``, ``"start_own"``: ``{name: {"state", "taken"}}``) and a weight change waiting for
the next epoch (``"next_weights"``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncloader._base import check_ranks
from asyncloader.sources._mix.state import TAILS, VERSION, Setup, place, top

_TOP = ("epoch", "drawn", "weights", "rank", "world_size", "distributed_tail", "sources")
_PLACE = ("epoch", "taken", "drawn")


def pack(place_: Mapping[str, Any], next_weights: Mapping[str, float] | None) -> dict[str, Any]:
    """The state of ``place_`` (its base the place itself)."""
    return packed(encode(place_), int(place_["drawn"]), owns(place_), next_weights)


def packed(
    base: str,
    drawn: int,
    own: tuple[dict[str, Any], dict[str, Any]],
    next_weights: Mapping[str, float] | None,
) -> dict[str, Any]:
    """The state: ``base`` (see :func:`encode`), ``drawn``, the own states (of the sources,
    of the epoch's start; see :func:`owns`), a weight change waiting."""
    state: dict[str, Any] = {"mix": VERSION, "base": base, "drawn": drawn, "own": own[0]}
    if own[1]:
        state["start_own"] = own[1]
    if next_weights is not None:
        state["next_weights"] = dict(next_weights)
    return state


def encode(place_: Mapping[str, Any]) -> str:
    """``place_`` without its own states and weight change, as one JSON string."""
    bare = {k: v for k, v in place_.items() if k != "next_weights"}
    bare["sources"] = {n: _bare(p) for n, p in place_["sources"].items()}
    if top(place_, "start") is not None:
        bare["start"] = {n: _bare(p) for n, p in place_["start"].items()}
    return json.dumps(bare, sort_keys=True)


def _bare(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("own", "own_taken")}


def owns(place_: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The own states of ``place_``'s sources and of its epoch's start: ``{name: {"state",
    "taken"}}`` for those that keep one."""
    start = top(place_, "start") or {}
    return _owns(place_["sources"]), _owns(start)


def _owns(entries: Mapping[str, Any]) -> dict[str, Any]:
    return {
        n: {"state": copy.deepcopy(p["own"]), "taken": place(p, "own_taken")}
        for n, p in entries.items()
        if place(p, "own") is not None
    }


def unpack(
    setup: Setup, state: Any, replay: Callable[[dict[str, Any], int], dict[str, Any]]
) -> dict[str, Any]:
    """The place a state describes: its base, moved on to its ``"drawn"`` by ``replay(base,
    drawn)`` (positions only), its own states put back.

    Raises:
        ValueError: ``state`` is not one this Mix can continue (naming the field or the
            setting that differs).
    """
    base, drawn = checked_packed(setup, state)
    out = replay(base, drawn) if drawn > base["drawn"] else base
    _put_own(out["sources"], state.get("own", {}))
    if top(out, "start") is not None:
        _put_own(out["start"], state.get("start_own", {}))
    return out


def checked_packed(setup: Setup, state: Any) -> tuple[dict[str, Any], int]:
    """A packed state's base place (checked) and draws.

    Raises:
        ValueError: Naming what is wrong, or the setting that differs from this Mix's.
    """
    if not isinstance(state, Mapping) or state.get("mix") != VERSION:
        raise ValueError(f"state is not a Mix state (version {VERSION}): {type(state).__name__}")
    try:
        base = json.loads(state["base"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("state['base'] must be the JSON of a Mix's place") from None
    check_state(setup, base)
    drawn = state.get("drawn")
    if not isinstance(drawn, int) or not _is_count(drawn) or drawn < base["drawn"]:
        raise ValueError(f"state['drawn'] must be an int >= its base's {base['drawn']}")
    _check_beside(setup, state)
    return base, drawn


def _check_beside(setup: Setup, state: Mapping[str, Any]) -> None:
    """Checks what a packed state holds beside its base."""
    for field in ("own", "start_own"):
        got = state.get(field, {})
        if not isinstance(got, Mapping) or not set(got) <= set(setup.names):
            raise ValueError(f"state[{field!r}] must map some of the sources to their states")
    if top(state, "next_weights") is not None:
        _check_names("state['next_weights']", state["next_weights"], setup.names)


def _put_own(entries: dict[str, Any], own: Mapping[str, Any]) -> None:
    for name, saved in own.items():
        if not isinstance(saved, Mapping) or not _is_count(saved.get("taken")):
            raise ValueError(f"state's own state of {name!r} must be {{'state', 'taken'}}")
        entries[name]["own"] = copy.deepcopy(saved.get("state"))
        entries[name]["own_taken"] = saved["taken"]


def check_state(setup: Setup, state: Any) -> None:
    """Checks that ``state`` is a Mix state this Mix can continue.

    Raises:
        ValueError: Naming the field that is missing or wrong, or the setting (seed, stop,
            shuffle, samples_per_epoch, sources) in which it differs from this Mix.
    """
    if not isinstance(state, Mapping) or state.get("mix") != VERSION:
        raise ValueError(f"state is not a Mix state (version {VERSION}): {type(state).__name__}")
    missing = [key for key in _TOP if key not in state]
    if missing:
        raise ValueError(f"state lacks {missing[0]!r}")
    for key in ("seed", "stop", "shuffle", "samples_per_epoch"):
        if state.get(key) != getattr(setup, key):
            raise ValueError(
                f"state was saved with {key}={state.get(key)!r}, this Mix has "
                f"{key}={getattr(setup, key)!r}: it would not continue the same order"
            )
    _check_places(setup, state)


def _check_places(setup: Setup, state: Mapping[str, Any]) -> None:
    _check_names("state['sources']", state["sources"], setup.names)
    _check_names("state['weights']", state["weights"], setup.names)
    if top(state, "next_weights") is not None:
        _check_names("state['next_weights']", state["next_weights"], setup.names)
    exhausted = top(state, "exhausted")
    if not isinstance(exhausted, list) or not set(exhausted) <= set(setup.names):
        raise ValueError(f"state['exhausted'] must list some of the sources, got {exhausted!r}")
    _check_counts(state)
    start = top(state, "start")
    if start is not None:
        _check_names("state['start']", start, setup.names)
    for name in setup.names:
        _check_place(f"state['sources'][{name!r}]", state["sources"][name])
        if start is not None:
            _check_place(f"state['start'][{name!r}]", start[name])


def _check_names(field: str, got: Any, names: Sequence[str]) -> None:
    if not isinstance(got, Mapping) or sorted(got) != list(names):
        keys = sorted(got) if isinstance(got, Mapping) else type(got).__name__
        raise ValueError(f"{field} holds {keys}, this Mix's sources are {list(names)}")


def _check_counts(state: Mapping[str, Any]) -> None:
    for key in ("epoch", "drawn"):
        if not _is_count(state[key]):
            raise ValueError(f"state[{key!r}] must be an int >= 0, got {state[key]!r}")
    if state["distributed_tail"] not in TAILS:
        raise ValueError(f"state['distributed_tail'] must be one of {TAILS}")
    try:
        check_ranks(state["rank"], state["world_size"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state's rank and world_size: {exc}") from None


def _check_place(field: str, entry: Any) -> None:
    if not isinstance(entry, Mapping) or any(k not in entry for k in _PLACE):
        raise ValueError(f"{field} must hold {list(_PLACE)}")
    for key in ("epoch", "taken", "drawn", "own_taken"):
        value = entry.get(key, 0)
        if not _is_count(value):
            raise ValueError(f"{field}[{key!r}] must be an int >= 0, got {value!r}")
    cuts = entry.get("cuts", [])
    if not isinstance(cuts, list) or not all(map(_is_cut, cuts)):
        raise ValueError(f"{field}['cuts'] must be a list of [world_size, taken, tail]")
    own = entry.get("own")
    if own is not None and not isinstance(own, Mapping):
        raise ValueError(f"{field}['own'] must be a source's own state (a dict) or None")


def _is_cut(cut: Any) -> bool:
    return (
        isinstance(cut, list)
        and len(cut) == 3
        and _is_count(cut[0])
        and cut[0] >= 1
        and _is_count(cut[1])
        and cut[2] in TAILS
    )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
