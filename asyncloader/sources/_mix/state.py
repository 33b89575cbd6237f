"""Where a :class:`~asyncloader.sources.Mix` stands, as a *place*: its format, a whole
epoch's start, and its move to another world size.

A place (the unpacked state, used inside; :mod:`.pack` packs it) holds the Mix epoch,
the draws made (``"drawn"``, which with seed and epoch is the draw generator's state), the
sources left out, the weights of the epoch, the place it was saved at (rank, world size,
tail), and per source (``"sources"``): its own epoch, the samples taken in it (``"taken"``),
those drawn in this Mix epoch (``"drawn"``), its cuts (map-style, at other world sizes), and
for an iterable source its own state (``"own"``, torchdata's protocol, taken when
``"own_taken"`` samples had been). With ``stop="never"``, ``"start"`` holds the sources'
places when the epoch began, so that it can begin again. Fields that hold their default are
left out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncloader.sources._mix.draw import Cursor, Layout, Uniforms
from asyncloader.sources._mix.sources import Member

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
