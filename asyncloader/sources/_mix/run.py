"""One iteration of a :class:`~asyncloader.sources.Mix` epoch, where the Mix is iterated (the
training process: the loader's puller thread or its event loop).

A :class:`Run` holds the committed cursor (what has been handed out: its state is the Mix's
``state_dict()``) and the iterators of the iterable sources it opened. The sync iteration
(:mod:`.sync`) reads map-style samples a block at a time; the async one
(:mod:`.ahead`) fetches them ahead. An iterable source is opened at its first draw,
where its place says (its own state loaded, then what it does not cover read and dropped).
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from asyncloader._base import source_state
from asyncloader.sources._mix.draw import Cursor, Draws, Layout
from asyncloader.sources._mix.pack import encode, owns, pack, packed
from asyncloader.sources._mix.sources import share_of
from asyncloader.sources._mix.state import from_state, named, to_state, top

#: Draws made at once where no source runs out (they are still counted one by one).
BLOCK = 1024


class Run:
    """One iteration of a Mix epoch from the state ``began`` (see the module docstring).

    Args:
        mix: The Mix (its setup, sources, and the weights waiting for the next epoch).
        began: The (checked) state the iteration starts from.
        layout: This process's place among the ranks.
    """

    def __init__(self, mix: Any, began: dict[str, Any], layout: Layout) -> None:
        self.mix, self.began, self.layout = mix, began, layout
        self.setup, self.members = mix._setup, mix._members
        self.weights = [float(began["weights"][n]) for n in self.setup.names]
        self.cursor = from_state(self.setup, began)
        self.start = top(began, "start")
        self.draws = Draws(
            self.setup.names, self.weights, self.setup.stop, self.setup.samples_per_epoch,
            share_of(self.members, layout),
        )  # fmt: skip
        self.iterators: dict[int, Any] = {}
        self.final: dict[str, Any] | None = None  # the place at the epoch's end
        # samples being handed out ahead of the cursor: their sources (a list, or an int64
        # array), and an iterator of what is left of them (see .sync.sync_samples)
        self.segment: tuple[Any, Iterator[Any]] | None = None
        self.base = encode(began)  # the packed state's base (see .state)
        self.start_own = owns(began)[1]
        self.iterable = [i for i, m in enumerate(self.members) if not m.is_map]

    def state(self) -> dict[str, Any]:
        """The Mix's state (packed, see :mod:`.pack`): where this iteration stands,
        between two samples. Cheap: the loader asks for it before every batch."""
        if self.final is not None:
            return pack(self.final, named(self.setup.names, self.mix._pending))
        c, drawn = self.cursor, self.cursor.position
        if self.segment is not None:
            picks, left = self.segment
            drawn += len(picks) - operator.length_hint(left)
        own: dict[str, Any] = {}
        for i in self.iterable:
            iterator = self.iterators.get(i)
            if iterator is not None:
                saved, taken = source_state(self.members[i].source, iterator), c.taken[i]
            else:
                saved, taken = copy.deepcopy(c.own[i]), c.own_taken[i]
            if saved is not None:
                own[self.setup.names[i]] = {"state": saved, "taken": taken}
        pending = named(self.setup.names, self.mix._pending)
        return packed(self.base, drawn, (own, self.start_own), pending)

    def full(self) -> dict[str, Any]:
        """The place where this iteration stands (the unpacked state)."""
        if self.final is not None:
            return copy.deepcopy(self.final)
        c = self.cursor.copy(self.setup.seed)
        if self.segment is not None:
            picks, left = self.segment
            took(c, picks[: len(picks) - operator.length_hint(left)])
        for i, iterator in self.iterators.items():
            c.own[i] = source_state(self.members[i].source, iterator)
            c.own_taken[i] = c.taken[i] if c.own[i] is not None else 0
        for i, own in enumerate(c.own):
            if own is not None and i not in self.iterators:
                c.own[i] = copy.deepcopy(own)
        return to_state(self.setup, c, self.weights, None, self.layout, self.start)

    def rebase(self) -> None:
        """The cursor changed in a way replaying positions cannot find again (an iterable
        source ran out, or was found at another epoch): the state's base is taken anew."""
        self.base = encode(self.full())

    def index(self, i: int, c: Cursor) -> int:
        """The item of map-style source ``i`` that cursor ``c``'s next draw of it reads."""
        order = self.members[i].order(c.epochs[i], c.cuts[i], self.layout)
        item: int = order[c.taken[i]]
        return item

    def block(self, c: Cursor, size: int) -> tuple[list[int], list[Any], bool]:
        """The next draws from cursor ``c``: ``(sources, items, by_rule)``, an item for each
        map-style draw (-1 for an iterable's). Up to ``size`` draws in which no source
        runs out (``c`` unchanged: the caller counts them as they go out), else the next one
        by the whole rule (``by_rule``: its stop rule already applied to ``c``); no draws
        once the epoch is over."""
        picks, items, by_rule = self.block_arrays(c, size)
        return picks.tolist(), items.tolist(), by_rule

    def block_arrays(self, c: Cursor, size: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """:meth:`block`, as two int64 arrays."""
        picks = self.draws.run(c, size)
        if not len(picks):
            i = self.draws.pick(c)
            if i is None:
                return picks, picks, True
            item = self.index(i, c) if self.members[i].is_map else -1
            return np.array([i], dtype=np.int64), np.array([item], dtype=np.int64), True
        items = np.full(len(picks), -1, dtype=np.int64)  # -1: an iterable's draw
        for i in np.flatnonzero(np.bincount(picks)).tolist():
            if self.members[i].is_map:
                order = self.members[i].order(c.epochs[i], c.cuts[i], self.layout)
                where = picks == i
                items[where] = order.items(c.taken[i], c.taken[i] + int(where.sum()))
        return picks, items, False

    def note(self, exc: BaseException, i: int, item: Any, ahead: int = 0) -> None:
        """Names in ``exc`` the source, item and draw that failed (``ahead`` draws after
        the cursor's)."""
        c = self.cursor
        what = f"item {item}" if item is not None else f"sample {c.taken[i]}"
        exc.add_note(
            f"asyncloader.sources.Mix: sources[{self.setup.names[i]!r}] {what} of its epoch "
            f"{c.epochs[i]} (draw {c.position + ahead} of Mix epoch {c.epoch})"
        )

    def ran_out(self, i: int) -> None:
        """Iterable source ``i`` had nothing left when drawn: its stop rule (a source whose
        epoch was empty cannot be restarted with ``"never"``)."""
        c = self.cursor
        if self.setup.stop == "never" and c.taken[i] == 0:
            raise self.draws.no_samples(i)
        self.draws.empty(c, i)
        self.rebase()

    def replay_left(self, i: int, dropped: int, left: int) -> int:
        """After reading past ``dropped`` of the ``left`` samples a saved position says
        source ``i`` had given: how many are still to read past in its next epoch (0: done).

        Raises:
            ValueError: ``"never"`` and its next epoch is empty.
        """
        c = self.cursor
        if dropped == left or self.setup.stop != "never":
            return 0
        if dropped == 0 and c.own[i] is None:
            raise self.draws.no_samples(i)
        c.restart(i)
        c.taken[i] = left - dropped
        self.rebase()
        return left - dropped

    def keep_own(self) -> None:
        """Keeps each open iterable source's own state in the cursor (before closing it), so
        that the state still says where it stood."""
        c = self.cursor
        for i, iterator in self.iterators.items():
            c.own[i] = source_state(self.members[i].source, iterator)
            c.own_taken[i] = c.taken[i] if c.own[i] is not None else 0

    def ended(self) -> None:
        """The epoch is over: its final state is kept (the next epoch of ``"never"`` goes on
        from it)."""
        self.final = self.full()


def took(c: Cursor, picks: list[int] | np.ndarray) -> None:
    """Counts in ``c`` the draws of ``picks`` (a list, or an int64 array), handed out."""
    taken, counts = c.taken, c.counts
    if isinstance(picks, np.ndarray):
        drawn: Any = enumerate(np.bincount(picks, minlength=len(taken)).tolist())
    elif len(taken) <= 16:
        drawn = enumerate(map(picks.count, range(len(taken))))
    else:
        drawn = Counter(picks).items()
    for i, n in drawn:
        taken[i] += n
        counts[i] += n
    c.position += len(picks)
