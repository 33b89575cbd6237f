"""A :class:`~asyncloader.sources.Mix` moved along its epochs on positions alone (no data
read): a saved state's draws replayed, and with ``stop="never"`` the sources carried from one
epoch to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncloader.sources._mix.draw import Draws, Layout
from asyncloader.sources._mix.sources import Member, share_of
from asyncloader.sources._mix.state import (
    Setup,
    begun,
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
    layout = Layout(int(base["rank"]), int(base["world_size"]), str(base["distributed_tail"]))
    cursor = from_state(setup, base)
    weights = [float(base["weights"][n]) for n in setup.names]
    share = share_of(members, layout)
    Draws(setup.names, weights, setup.stop, setup.samples_per_epoch, share).advance(cursor, drawn)
    if cursor.position != drawn:
        raise ValueError(f"state['drawn']={drawn} is past its epoch's end")
    return to_state(setup, cursor, weights, None, layout, top(base, "start"))


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
