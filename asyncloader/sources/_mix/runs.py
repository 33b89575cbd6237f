"""One iteration of a :class:`~asyncloader.sources.Mix` epoch, where the Mix is iterated (the
training process: the loader's puller thread or its event loop), and its two sync readers.

A :class:`Run` holds the committed cursor (what has been handed out: its state is the Mix's
``state_dict()``) and the iterators of the iterable sources it opened. An iterable source is
opened at its first draw, where its place says (its own state loaded, then what it does not
cover read and dropped). It is read in one of three ways:

- :class:`SyncRun` (all sources sync), on the loader's puller thread: draws made a block at a
  time, map-style samples read ``READ`` at a time and handed out from a list, an iterable
  source's one at a time;
- :class:`MixSampler`: a Mix of sync map-style sources read as a map-style dataset. Its
  sampler yields keys, drawn where the sampler is iterated (the loader's event loop); the
  samples are read wherever the dataset's ``__getitem__`` runs (the workers, or the loader's
  fetch threads). A key is an int, ``~(index << shift | number)`` for item ``index`` of
  source ``number`` (sources numbered in sorted-name order; ``shift`` the bits that hold a
  number), so negative: an index of another sampler (``>= 0``) is refused, not read. Ints,
  because keys travel to the workers with every batch, where a tuple costs several times an
  int to pickle. The keys are the draws of the sync iteration, made the same way from the
  same :class:`Run`: the k-th key is the k-th sample's, so the map path and the iterable
  path give the same samples in the same order. The run's state counts the keys handed out;
- the async iteration (:mod:`.ahead`), which fetches map-style samples ahead.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from asyncloader._base import source_state
from asyncloader.sources._mix.draws import CHUNK, Cursor, Draws, Layout
from asyncloader.sources._mix.members import close_sync, open_sync, share_of, skip_sync
from asyncloader.sources._mix.state import (
    encode,
    from_state,
    named,
    owns,
    pack,
    packed,
    to_state,
    top,
)

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
        """The Mix's state (packed, see :mod:`.state`): where this iteration stands,
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


#: Map-style samples read at once, ahead of the one handed out (the memory it takes).
READ = 128


class SyncRun(Run):
    """A Run of sync sources, iterated by :func:`sync_samples`."""

    def __init__(self, mix: Any, began: dict[str, Any], layout: Layout) -> None:
        super().__init__(mix, began, layout)
        self.getters = [m.source.__getitem__ if m.is_map else None for m in self.members]
        self.pulled: Any = None

    def map_end(self, picks: list[int], start: int) -> int:
        """The end of the map-style draws of ``picks`` from ``start``, at most ``READ`` of
        them."""
        end = min(len(picks), start + READ)
        if not self.iterable:
            return end
        getters = self.getters
        for k in range(start, end):
            if getters[picks[k]] is None:
                return k
        return end

    def read(
        self, picks: list[int], items: list[Any], start: int, end: int
    ) -> tuple[list[Any], BaseException | None]:
        """The samples of map-style draws ``start`` to ``end`` (of the cursor's), read now;
        when one fails, those before it and its error (named: :meth:`note`)."""
        getters, samples = self.getters, list[Any]()
        append = samples.append
        try:
            for k in range(start, end):
                append(getters[picks[k]](items[k]))  # type: ignore[misc]
        except Exception as exc:
            k = start + len(samples)
            self.note(exc, picks[k], items[k], k - start)
            return samples, exc
        return samples, None

    def pull_one(self, i: int) -> bool:
        """Reads the next sample of iterable source ``i`` into :attr:`pulled`, counted;
        False when it had none left (its stop rule applied)."""
        try:
            self.pulled = self.pull(i)
        except StopIteration:
            self.ran_out(i)
            return False
        except Exception as exc:
            self.note(exc, i, None)
            raise
        self.cursor.took(i)
        return True

    def pull(self, i: int) -> Any:
        """The next sample of iterable source ``i`` (opened where its place says first)."""
        iterator = self.iterators.get(i)
        if iterator is None:
            iterator = self.iterators[i] = self._open(i)
        return next(iterator)

    def _open(self, i: int) -> Iterator[Any]:
        c, member = self.cursor, self.members[i]
        left = c.taken[i] - c.own_taken[i]
        while True:
            iterator = open_sync(member, c.epochs[i], c.own[i])
            left = self.replay_left(i, skip_sync(iterator, left), left)
            if not left:
                return iterator
            close_sync(member, iterator)

    def ran_out(self, i: int) -> None:
        close_sync(self.members[i], self.iterators.pop(i, None))
        super().ran_out(i)

    def close(self) -> None:
        self.keep_own()
        for i, iterator in self.iterators.items():
            close_sync(self.members[i], iterator)
        self.iterators.clear()


def sync_samples(run: SyncRun) -> Iterator[Any]:
    """The samples of ``run``'s epoch, each counted in the run's cursor before it goes out:
    map-style samples read a block at a time and handed out from a list (counted by what is
    left of it, see :attr:`Run.segment`), an iterable's one at a time."""
    c = run.cursor
    try:
        while True:
            picks, items, _ = run.block(c, BLOCK)
            if not picks:
                break
            start = 0
            while start < len(picks):
                end = run.map_end(picks, start)
                if end == start:  # an iterable source's draw
                    if not run.pull_one(picks[start]):
                        break  # it ran out: the draws after it may change, drawn again
                    yield run.pulled
                    start += 1
                    continue
                samples, failure = run.read(picks, items, start, end)
                run.segment = (picks[start:end], iter(samples))
                yield from run.segment[1]
                took(c, run.segment[0])
                run.segment = None
                if failure is not None:
                    raise failure
                start = end
        run.ended()
    finally:
        run.close()


def shift_of(sources: int) -> int:
    """The bits of a key that hold the source's number, of ``sources`` sources."""
    return (sources - 1).bit_length()


def decode(key: Any, shift: int) -> tuple[int, int]:
    """``(source number, index)`` of ``key``.

    Raises:
        TypeError: ``key`` is not a Mix's key (an int < 0).
    """
    if not isinstance(key, int) or isinstance(key, bool) or key >= 0:
        raise bad_key(key)
    return ~key & ((1 << shift) - 1), ~key >> shift


def bad_key(key: Any) -> TypeError:
    return TypeError(
        f"a Mix's keys come from its loader_sampler() (negative ints), got {key!r}: use "
        "DataLoader(mix, sampler=mix.loader_sampler()), or read the Mix with iter()"
    )


def mix_keys(run: Run) -> Iterator[int]:
    """The keys of ``run``'s epoch (see the module docstring), each counted in the run's
    cursor before it goes out."""
    return itertools.chain.from_iterable(_blocks(run))


def _blocks(run: Run) -> Iterator[Iterator[int]]:
    """Iterators over the keys of ``run``'s draws, a block at a time, handed out from
    :attr:`Run.segment` (its state counts those taken from it); the final state kept at the
    epoch's end."""
    c, shift = run.cursor, shift_of(len(run.members))
    while True:
        picks, items, _ = run.block_arrays(c, CHUNK)
        if not len(picks):
            break
        run.segment = (picks, iter((~(items << shift | picks)).tolist()))
        yield run.segment[1]
        took(c, picks)
        run.segment = None
    run.ended()


class MixSampler(Sampler[int]):
    """The sampler of a map-style Mix (``Mix.loader_sampler()``): each ``iter()`` is an
    iteration of the Mix where it stands (its epoch, or the state loaded), as ``iter(mix)``
    is; ``len()`` is the Mix's; ``set_epoch`` is the Mix's. Already this rank's share: the
    Mix splits each source across ranks itself."""

    def __init__(self, mix: Any) -> None:
        self.mix = mix

    def __iter__(self) -> Iterator[int]:
        return mix_keys(self.mix._open_run(Run))

    def __len__(self) -> int:
        return len(self.mix)

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"MixSampler({self.mix!r})"
