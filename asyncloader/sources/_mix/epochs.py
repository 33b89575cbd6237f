"""A :class:`~asyncloader.sources.Mix` moved along its epochs on positions alone (no data
read): a saved state's draws replayed, each source's count at a saved position
(:class:`Tally`), and with ``stop="never"`` the sources carried from one epoch to the next.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from asyncloader.sources._mix.draws import Cursor, Draws, Layout
from asyncloader.sources._mix.members import Member, share_of
from asyncloader.sources._mix.state import (
    Setup,
    begun,
    checked_packed,
    from_state,
    moved,
    next_epoch,
    start_of,
    to_state,
    top,
)


def replay(
    setup: Setup, members: Sequence[Member], base: dict[str, Any], drawn: int
) -> dict[str, Any]:
    """``base`` moved on to draw ``drawn`` of its epoch, at the place it was saved at.

    Raises:
        ValueError: ``drawn`` is past the epoch's end.
    """
    layout, cursor, draws = drawing(setup, members, base)
    draws.advance(cursor, drawn)
    if cursor.position != drawn:
        raise ValueError(f"state['drawn']={drawn} is past its epoch's end")
    return to_state(setup, cursor, draws.weights, None, layout, top(base, "start"))


def drawing(
    setup: Setup, members: Sequence[Member], base: Mapping[str, Any]
) -> tuple[Layout, Cursor, Draws]:
    """The place ``base`` was saved at, its cursor, and the draw rule of its epoch."""
    layout = Layout(int(base["rank"]), int(base["world_size"]), str(base["distributed_tail"]))
    weights = [float(base["weights"][n]) for n in setup.names]
    share = share_of(members, layout)
    draws = Draws(setup.names, weights, setup.stop, setup.samples_per_epoch, share)
    return layout, from_state(setup, base), draws


class Tally:
    """Each source's draws in its Mix epoch up to the position a packed state records
    (``Mix.counts_at``), on positions alone.

    The cursor of the last state asked is kept: a later position of the same base (the
    states of one iteration, taken in order) costs the draws between the two only. Locked:
    the loader's ``stats`` may be read from any thread. A copy keeps nothing.
    """

    def __init__(self, setup: Setup, members: Sequence[Member]) -> None:
        self.setup, self.members = setup, members
        self._lock = threading.Lock()
        self._held: tuple[str, Cursor, Draws] | None = None  # (base, its cursor, rule)

    def at(self, state: Mapping[str, Any]) -> list[int]:
        """The draws of each source (sorted names' order) before ``state``'s position.

        Raises:
            ValueError: ``state`` is not a state of this Mix, or is past its epoch's end.
        """
        base, drawn = checked_packed(self.setup, state)
        if drawn == base["drawn"]:
            return [int(base["sources"][n]["drawn"]) for n in self.setup.names]
        with self._lock:
            held = self._held
            if held is None or held[0] != state["base"] or held[1].position > drawn:
                _, cursor, draws = drawing(self.setup, self.members, base)
                held = self._held = (state["base"], cursor, draws)
            cursor = held[1]
            held[2].advance(cursor, drawn)
            if cursor.position != drawn:
                self._held = None
                raise ValueError(f"state['drawn']={drawn} is past its epoch's end")
            return list(cursor.counts)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Tally, (self.setup, self.members))


def advance(
    setup: Setup,
    members: Sequence[Member],
    origin: dict[str, Any],
    epoch: int,
    weights: Sequence[float],
    layout: Layout,
) -> dict[str, Any]:
    """``"never"``: the start of Mix epoch ``epoch`` (not before ``origin``'s), the sources
    going on from ``origin`` through the end of its epoch and every epoch between; the
    epochs after ``origin``'s drawn with ``weights``."""
    if epoch == origin["epoch"]:
        return start_of(setup, origin)
    if origin["world_size"] != layout.world_size:
        origin = moved(setup, origin, members, layout)
    share = share_of(members, layout)
    cursor = from_state(setup, origin)
    drawing = [float(origin["weights"][n]) for n in setup.names]
    limit = int(setup.samples_per_epoch or 0)
    for number in range(int(origin["epoch"]), epoch):
        Draws(setup.names, drawing, "never", limit, share).advance(cursor, limit)
        cursor, drawing = next_epoch(setup, cursor, number + 1), list(weights)
    return begun(setup, cursor, weights, layout)
