"""The draws of a :class:`~asyncloader.sources.Mix`, on positions alone: which source each
sample of an epoch comes from, and which sample of a map-style source it is.

Draw rule: draw ``p`` of Mix epoch ``e`` (counted from 0) takes the uniform ``u_p``, the
``p % 4096``-th ``random()`` of ``Random(f"mix:{seed}:{e}:{p // 4096}")``, and
picks the source whose interval of the cumulative weights (sources by sorted name, those
still drawn, weight > 0) holds ``u_p * total``. The uniforms depend on (seed, epoch, p) only,
never on weights, ranks, data or timing: every rank draws the same sequence, and a position
is found again without replaying the draws before it. A source picked with nothing left:
``"first_exhausted"`` ends the epoch there; ``"all_exhausted"`` leaves it out and draws
``u_p`` again among the others (weights renormalised); ``"never"`` starts its next epoch.

A map-style source's own order on this rank: source epoch ``k`` of source ``name`` is
``torch.randperm(n)`` seeded from (seed, name, k) (``range(n)`` unshuffled), split across
ranks as the loader's rank sampler splits its own: rows of ``world_size``, rank ``r`` takes
the ``r``-th entry of each, the tail padded (head repeated) or dropped. A resume at another
world size cuts it: what every rank of ``W`` had not taken, ``order[taken * W:]``, is split
again (the arithmetic of :mod:`asyncloader._base.ranks`, the rule of
``asyncloader._config.rank_sampler``).
"""

from __future__ import annotations

import hashlib
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from asyncloader._base import remainder_len, remainder_span, share, split_span

STOPS = ("first_exhausted", "all_exhausted", "never")
CHUNK = 4096

#: An interruption of a map-style source's epoch at another world size:
#: ``[world_size, taken per rank, tail]`` (JSON keeps it a list).
MemberCut = Sequence[Any]


class Layout(NamedTuple):
    """This process's place: rank, world size, and the tail rule of map-style splits."""

    rank: int
    world_size: int
    tail: str


class Uniforms:
    """The uniforms ``u_p`` of one Mix epoch, made 4096 at a time (see the module rule)."""

    __slots__ = ("_chunk", "_key", "_values")

    def __init__(self, seed: int, epoch: int) -> None:
        self._key = f"mix:{seed}:{epoch}"
        self._chunk = -1
        self._values = np.empty(0)

    def at(self, position: int) -> float:
        return float(self._chunk_of(position)[position % CHUNK])

    def run(self, start: int, end: int) -> np.ndarray:
        """``u_start ... u_(end-1)``, as far as the chunk of ``start`` goes."""
        values = self._chunk_of(start)
        first = start % CHUNK
        return values[first : first + min(end - start, CHUNK - first)]

    def _chunk_of(self, position: int) -> np.ndarray:
        chunk = position // CHUNK
        if chunk != self._chunk:
            self._values = random_chunk(f"{self._key}:{chunk}")
            self._chunk = chunk
        return self._values


_STREAMS = threading.local()  # a numpy MT19937 per thread, seeded anew for each chunk


def random_chunk(key: str) -> np.ndarray:
    """The first ``CHUNK`` ``random()`` of ``random.Random(key)``, made at once: CPython
    seeds its Mersenne Twister from a str by ``init_by_array`` over the 32-bit words (least
    significant first) of the int of ``key`` and its SHA-512, and makes each double from two
    outputs, as numpy's ``RandomState`` (whose stream numpy keeps frozen) does once seeded
    with the same words; tests/integration/sources/test_mix.py checks the two agree."""
    stream = getattr(_STREAMS, "stream", None)
    if stream is None:
        stream = _STREAMS.stream = np.random.RandomState()
    raw = key.encode()
    whole = int.from_bytes(raw + hashlib.sha512(raw).digest(), "big")
    words = whole.to_bytes(max(1, (whole.bit_length() + 31) // 32) * 4, "little")
    stream.seed(np.frombuffer(words, dtype="<u4"))
    return stream.random_sample(CHUNK)


class Picker:
    """Picks among the sources still drawn with weight > 0, by their cumulative weights."""

    __slots__ = ("cum", "cum_head", "index", "indices", "last", "total")

    def __init__(self, weights: Sequence[float], dropped: int) -> None:
        self.index = [i for i, w in enumerate(weights) if w > 0 and not dropped >> i & 1]
        self.cum: list[float] = []
        self.total = 0.0
        for i in self.index:
            self.total += weights[i]
            self.cum.append(self.total)
        self.last = len(self.index) - 1
        # for many uniforms at once: the search over all but the last, as pick()'s
        self.cum_head = np.array(self.cum[: max(self.last, 0)], dtype=float)
        self.indices = np.array(self.index, dtype=np.int64)

    def pick(self, u: float) -> int | None:
        """The source holding ``u * total``; None when none is left. Rounding at the top
        end goes to the last source (weight > 0; the search stops there, as
        ``random.choices``' does): a source of weight 0 is never picked."""
        if self.last < 0:
            return None
        return self.index[bisect_right(self.cum, u * self.total, 0, self.last)]

    def picks(self, us: np.ndarray) -> np.ndarray:
        """:meth:`pick` of each of ``us`` (the same float products and comparisons)."""
        return self.indices[np.searchsorted(self.cum_head, us * self.total, side="right")]


@dataclass(eq=False, slots=True)
class Cursor:
    """Where an iteration of one Mix epoch stands, on positions: draws made, each source's
    own epoch and samples taken in it, and (iterable sources) its own state when it was
    last saved. Lists are indexed like the sorted source names; ``dropped`` is a bit mask of
    the sources left out (``"all_exhausted"``)."""

    epoch: int
    position: int
    ended: bool
    dropped: int
    epochs: list[int]
    taken: list[int]
    counts: list[int]
    cuts: list[list[MemberCut]]
    own: list[Any]
    own_taken: list[int]
    uniforms: Uniforms

    def copy(self, seed: int) -> Cursor:
        """A copy (lists copied; own states shared: they are replaced, never changed)."""
        return Cursor(
            self.epoch, self.position, self.ended, self.dropped, list(self.epochs),
            list(self.taken), list(self.counts), list(self.cuts), list(self.own),
            list(self.own_taken), Uniforms(seed, self.epoch),
        )  # fmt: skip

    def took(self, i: int) -> None:
        """Source ``i`` gave the sample of this position."""
        self.position += 1
        self.taken[i] += 1
        self.counts[i] += 1

    def restart(self, i: int) -> None:
        """Source ``i`` starts its next epoch (``"never"``)."""
        self.epochs[i] += 1
        self.taken[i] = self.own_taken[i] = 0
        self.cuts[i], self.own[i] = [], None


class Draws:
    """The draw rule over a :class:`Cursor` (see the module docstring).

    Args:
        names: The sources' names, sorted (for messages).
        weights: Their weights, in that order.
        stop: One of :data:`STOPS`.
        limit: Draws in the epoch at most (``samples_per_epoch``), or None.
        share: ``share(i, epoch, cuts)``: samples map-style source ``i`` gives this rank in
            its epoch ``epoch`` cut by ``cuts``; None for an iterable source (its end is found
            by reading it).
    """

    def __init__(
        self,
        names: Sequence[str],
        weights: Sequence[float],
        stop: str,
        limit: int | None,
        share: Callable[[int, int, list[MemberCut]], int | None],
    ) -> None:
        self.names, self.weights, self.stop, self.limit = names, list(weights), stop, limit
        self._share = share
        self._pickers: dict[int, Picker] = {}

    def picker(self, dropped: int) -> Picker:
        found = self._pickers.get(dropped)
        if found is None:
            found = self._pickers[dropped] = Picker(self.weights, dropped)
        return found

    def pick(self, c: Cursor) -> int | None:
        """The source of draw ``c.position``, or None once the epoch is over; a map-style
        source picked with nothing left gets the stop rule first (:meth:`empty`)."""
        if c.ended or (self.limit is not None and c.position >= self.limit):
            c.ended = True
            return None
        u = c.uniforms.at(c.position)
        while True:
            i = self.picker(c.dropped).pick(u)
            if i is None:
                c.ended = True
                return None
            n = self._share(i, c.epochs[i], c.cuts[i])
            if n is None or c.taken[i] < n:
                return i
            if not self.empty(c, i):
                return None

    def run(self, c: Cursor, size: int) -> np.ndarray:
        """The sources of up to ``size`` draws from ``c.position`` in which no map-style
        source runs out, so that the rule is plain picking (``c`` is not changed); none
        when the next draw needs :meth:`pick` (a source runs out, or the epoch is over)."""
        end = c.position + size if self.limit is None else min(c.position + size, self.limit)
        picker = self.picker(c.dropped)
        if c.ended or end <= c.position or picker.last < 0:
            return np.empty(0, dtype=np.int64)
        picks = picker.picks(c.uniforms.run(c.position, end))
        drawn = np.bincount(picks, minlength=len(self.weights))
        cut = len(picks)
        for i in np.flatnonzero(drawn).tolist():
            n = self._share(i, c.epochs[i], c.cuts[i])
            if n is not None and c.taken[i] + drawn[i] > n:  # its draw n - taken finds it empty
                cut = min(cut, int(np.flatnonzero(picks == i)[n - c.taken[i]]))
        return picks[:cut]

    def empty(self, c: Cursor, i: int) -> bool:
        """Source ``i`` was picked with nothing left: applies the stop rule; False when the
        epoch ends there.

        Raises:
            ValueError: ``"never"``, and its next epoch has no samples either.
        """
        if self.stop == "first_exhausted":
            c.ended = True
            return False
        if self.stop == "all_exhausted":
            c.dropped |= 1 << i
            return True
        c.restart(i)
        if self._share(i, c.epochs[i], c.cuts[i]) == 0:
            raise self.no_samples(i)
        return True

    def no_samples(self, i: int) -> ValueError:
        return ValueError(
            f"sources[{self.names[i]!r}] has no samples (on this rank): stop='never' "
            "cannot restart it"
        )

    def advance(self, c: Cursor, target: int) -> None:
        """Moves ``c`` to draw ``target`` (or its epoch's end, if sooner) on positions: the
        draws' sources counted, a map-style source's end met by the stop rule; an iterable
        source's ``taken`` may run past its end, which opening it finds (``"never"``)."""
        while c.position < target and not c.ended:
            picks = self.run(c, min(CHUNK, target - c.position))
            if len(picks):
                drawn = np.bincount(picks, minlength=len(self.weights)).tolist()
                for source, n in enumerate(drawn):
                    c.taken[source] += n
                    c.counts[source] += n
                c.position += len(picks)
            elif (i := self.pick(c)) is not None:
                c.took(i)


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``, the same in every process and Python version."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def share_len(n: int, cuts: Sequence[MemberCut], layout: Layout) -> int:
    """Samples of an order of ``n`` cut by ``cuts`` that this rank takes."""
    return share(remainder_len(n, cuts), layout.world_size, layout.tail)


def rank_order(
    n: int, key: tuple[Any, ...], shuffle: bool, cuts: Sequence[MemberCut], layout: Layout
) -> torch.Tensor:
    """This rank's order of a map-style source's epoch: the permutation seeded from
    ``key`` (seed, name, epoch), cut by ``cuts``, split by ``layout``."""
    if shuffle:
        generator = torch.Generator().manual_seed(stable_seed(*key))
        order = torch.randperm(n, generator=generator)
    else:
        order = torch.arange(n)
    for world_size, taken, tail in cuts:
        start, end = remainder_span(len(order), world_size, taken, tail)
        order = order[start:end]
    copies, entries = split_span(len(order), *layout)
    return (order.repeat(copies) if copies > 1 else order)[entries]


class Order:
    """One rank's order of a map-style source's epoch, read as ints 4096 at a time."""

    __slots__ = ("_chunk", "_items", "_tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self._chunk = -1
        self._items: list[int] = []

    def items(self, start: int, end: int) -> np.ndarray:
        """Entries ``[start, end)``."""
        return self._tensor[start:end].numpy()

    def __getitem__(self, k: int) -> int:
        chunk = k // CHUNK
        if chunk != self._chunk:
            self._items = self._tensor[chunk * CHUNK : (chunk + 1) * CHUNK].tolist()
            self._chunk = chunk
        return self._items[k % CHUNK]
