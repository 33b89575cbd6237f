"""Where a :class:`~asyncloader.sources.Mix` stands, as a *place*: its format, a whole
epoch's start, its move to another world size; and the saved state, packed, unpacked and
checked.

A place (the unpacked state, used inside; packed as below) holds the Mix epoch,
the draws made (``"drawn"``, which with seed and epoch is the draw generator's state), the
sources left out, the weights of the epoch, the place it was saved at (rank, world size,
tail), and per source (``"sources"``): its own epoch, the samples taken in it (``"taken"``),
those drawn in this Mix epoch (``"drawn"``), its cuts (map-style, at other world sizes), and
for an iterable source its own state (``"own"``, torchdata's protocol, taken when
``"own_taken"`` samples had been). With ``stop="never"``, ``"start"`` holds the sources'
places when the epoch began, so that it can begin again. Fields that hold their default are
left out.

The state (``state_dict()``, JSON-friendly, ``"mix": 1``) is packed, because the loader
copies it before every batch: ``"base"``, a place  without its own
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
from dataclasses import dataclass
from typing import Any

from asyncloader._base import check_ranks
from asyncloader.sources._mix.draws import Cursor, Layout, Uniforms
from asyncloader.sources._mix.members import Member

VERSION = 1
TAILS = ("pad", "drop")
#: Left out of a state where they hold these (the loader copies a state before each batch).
_TOP_DEFAULTS: dict[str, Any] = {"ended": False, "exhausted": [], "next_weights": None,
                                 "start": None}  # fmt: skip
_PLACE_DEFAULTS: dict[str, Any] = {"cuts": [], "own": None, "own_taken": 0}


@dataclass(frozen=True, slots=True)
class Setup:
    """What a state must agree with to continue a Mix's order."""

    names: tuple[str, ...]
    seed: int
    stop: str
    shuffle: bool
    samples_per_epoch: int | None


def to_state(
    setup: Setup,
    c: Cursor,
    weights: Sequence[float],
    next_weights: Sequence[float] | None,
    layout: Layout,
    start: dict[str, Any] | None,
) -> dict[str, Any]:
    """The state of cursor ``c`` (its own states as they are: copy them first if live)."""
    names = setup.names
    state = {
        "mix": VERSION,
        "seed": setup.seed,
        "stop": setup.stop,
        "shuffle": setup.shuffle,
        "samples_per_epoch": setup.samples_per_epoch,
        "epoch": c.epoch,
        "drawn": c.position,
        "weights": dict(zip(names, weights, strict=True)),
        "rank": layout.rank,
        "world_size": layout.world_size,
        "distributed_tail": layout.tail,
        "sources": places(setup, c),
    }
    if c.ended:
        state["ended"] = True
    if c.dropped:
        state["exhausted"] = [n for i, n in enumerate(names) if c.dropped >> i & 1]
    if next_weights is not None:
        state["next_weights"] = dict(zip(names, next_weights, strict=True))
    if start is not None:
        state["start"] = start
    return state


def top(state: Mapping[str, Any], key: str) -> Any:
    """``state[key]``, or its default where a state leaves it out."""
    return state.get(key, _TOP_DEFAULTS[key])


def place(state: Mapping[str, Any], key: str) -> Any:
    """``place[key]`` of a source's place, or its default where it is left out."""
    return state.get(key, _PLACE_DEFAULTS[key])


def places(setup: Setup, c: Cursor) -> dict[str, Any]:
    """Each source's place in cursor ``c``, by name (defaults left out)."""
    out = {}
    for i, name in enumerate(setup.names):
        entry: dict[str, Any] = {"epoch": c.epochs[i], "taken": c.taken[i], "drawn": c.counts[i]}
        if c.cuts[i]:
            entry["cuts"] = [list(cut) for cut in c.cuts[i]]
        if c.own[i] is not None:
            entry["own"], entry["own_taken"] = c.own[i], c.own_taken[i]
        out[name] = entry
    return out


def from_state(setup: Setup, state: Mapping[str, Any]) -> Cursor:
    """The cursor a (checked) state describes."""
    names = setup.names
    got = [state["sources"][n] for n in names]
    dropped = sum(1 << names.index(n) for n in top(state, "exhausted"))
    return Cursor(
        epoch=int(state["epoch"]),
        position=int(state["drawn"]),
        ended=bool(top(state, "ended")),
        dropped=dropped,
        epochs=[int(p["epoch"]) for p in got],
        taken=[int(p["taken"]) for p in got],
        counts=[int(p["drawn"]) for p in got],
        cuts=[[list(cut) for cut in place(p, "cuts")] for p in got],
        own=[copy.deepcopy(place(p, "own")) for p in got],
        own_taken=[int(place(p, "own_taken")) for p in got],
        uniforms=Uniforms(setup.seed, int(state["epoch"])),
    )


def fresh_cursor(setup: Setup, epoch: int, member_epoch: int) -> Cursor:
    """Mix epoch ``epoch`` from its start, every source at the start of ``member_epoch``."""
    n = len(setup.names)
    return Cursor(
        epoch, 0, False, 0, [member_epoch] * n, [0] * n, [0] * n, [[] for _ in range(n)],
        [None] * n, [0] * n, Uniforms(setup.seed, epoch),
    )  # fmt: skip


def next_epoch(setup: Setup, c: Cursor, epoch: int) -> Cursor:
    """``stop="never"``: Mix epoch ``epoch`` beginning where cursor ``c`` ended: each source
    goes on from its place."""
    out = c.copy(setup.seed)
    out.epoch, out.position, out.ended, out.dropped = epoch, 0, False, 0
    out.counts = [0] * len(setup.names)
    out.uniforms = Uniforms(setup.seed, epoch)
    return out


def begun(setup: Setup, c: Cursor, weights: Sequence[float], layout: Layout) -> dict[str, Any]:
    """The state of a cursor at its epoch's start (its places are the epoch's start)."""
    state = to_state(setup, c, weights, None, layout, None)
    if setup.stop == "never":
        state["start"] = copy.deepcopy(state["sources"])
    return state


def start_of(setup: Setup, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state``'s epoch from its beginning (with ``stop="never"``, from its ``"start"``)."""
    out = copy.deepcopy(dict(state))
    out.update(drawn=0)
    for key in ("ended", "exhausted"):
        out.pop(key, None)
    if setup.stop == "never" and top(state, "start") is not None:
        out["sources"] = copy.deepcopy(state["start"])
    else:
        epoch = int(state["epoch"])
        out["sources"] = {n: {"epoch": epoch, "taken": 0, "drawn": 0} for n in state["sources"]}
    for entry in out["sources"].values():
        entry["drawn"] = 0
    return out


def moved(
    setup: Setup, state: Mapping[str, Any], members: Sequence[Member], layout: Layout
) -> dict[str, Any]:
    """``state`` (checked) continued at ``layout``'s world size: each map-style source's
    epoch is cut where every old rank stood (the new ranks split what was left), each
    iterable source with ``elastic_state`` (``ShardedSource``) moves its own state; the
    draws go on from the same position."""
    out = copy.deepcopy(dict(state))
    old = (int(state["world_size"]), str(state["distributed_tail"]))
    for member in members:
        out["sources"][member.name] = _moved_place(out["sources"][member.name], member, old)
        if top(out, "start") is not None:
            out["start"][member.name] = _moved_place(out["start"][member.name], member, old)
    out.update(rank=layout.rank, world_size=layout.world_size, distributed_tail=layout.tail)
    return out


def _moved_place(entry: dict[str, Any], member: Member, old: tuple[int, str]) -> dict[str, Any]:
    world_size, tail = old
    if member.is_map:
        if entry["taken"]:
            entry["cuts"] = [*place(entry, "cuts"), [world_size, entry["taken"], tail]]
        entry["taken"] = 0
        return entry
    own, elastic = place(entry, "own"), getattr(member.source, "elastic_state", None)
    if own is not None and own.get("dataset") is not None and callable(elastic):
        entry["own"] = {"dataset": elastic([own["dataset"]]), "iterator": None}
        entry["taken"] -= place(entry, "own_taken")  # what is still to be read past, if any
        entry["own_taken"] = 0
    return entry


def named(names: Sequence[str], values: Sequence[float] | None) -> dict[str, float] | None:
    """``{name: value}`` (None for None)."""
    return None if values is None else dict(zip(names, values, strict=True))


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
