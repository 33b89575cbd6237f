"""The order a ShardedSource hands out samples in: a fixed interleave, then a shuffle buffer.

Nothing here reads data or depends on timing, so the same (seed, epoch, rank) always gives
the same order, and the first ``n`` steps can be replayed on sample *positions* alone.

Interleave rule: up to ``width`` slices are open at once, starting with the first ``width``
in plan order. The interleave takes one sample from each open slot in turn (round robin);
when a slot's slice has no samples left, the next unopened slice in plan order takes that
slot and is read at once, in the same turn; with none left, the slot closes::

    slots   [A B C]  ->  A0 B0 C0 A1 B1 C1 ...   B ends: [A D C]  ->  ... A4 D0 C4 A5 D1 ...

Shuffle buffer: before draw ``k`` (counted from 0), samples enter in interleave order until
it holds :func:`fill_target` ``= min(size, initial + k)`` (or the interleave is done); then one
is drawn with ``rng.randrange(len(buffer))``, swapped to the end and popped. So the first
sample goes out once ``initial`` are in, and the buffer then grows by one per draw until it
holds ``size`` (webdataset's ``initial``): the first batch waits for ``initial`` samples, not
for a full buffer. The draws depend on the buffer's length only, never on its contents, which
is what lets :func:`rewind` replay them on positions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple


class Interleave:
    """The round-robin state over ``n`` slices in plan order (see the module rule).

    Args:
        n: Slices in this rank's plan.
        width: Slices open at once (``shard_concurrency``).
    """

    def __init__(self, n: int, width: int) -> None:
        self.n = n
        self.slots = list(range(min(width, n)))
        self.cursor = 0
        self.next_slice = len(self.slots)
        self.taken = dict.fromkeys(self.slots, 0)  # open slice -> samples taken from it

    def current(self) -> int | None:
        """The slice whose turn it is, or None when every slice has ended."""
        return self.slots[self.cursor] if self.slots else None

    def took(self, samples: int = 1) -> None:
        """The current slice gave a sample (more than one only with one slot open): the
        turn passes to the next slot."""
        self.taken[self.slots[self.cursor]] += samples
        self.cursor = (self.cursor + 1) % len(self.slots)

    def ended(self) -> None:
        """The current slice has no samples left: the next in plan order takes its slot."""
        del self.taken[self.slots[self.cursor]]
        if self.next_slice < self.n:
            self.slots[self.cursor] = self.next_slice
            self.taken[self.next_slice] = 0
            self.next_slice += 1
        else:
            self.slots.pop(self.cursor)
            self.cursor = self.cursor % len(self.slots) if self.slots else 0


def fill_target(size: int, initial: int, k: int) -> int:
    """Samples the shuffle buffer holds before draw ``k``: ``initial``, one more per draw,
    at most ``size``."""
    return min(size, initial + k)


def draw(buffer: list[Any], rng: random.Random | None) -> Any:
    """Takes the next sample out of the shuffle buffer (the first one without ``rng``)."""
    if rng is None:
        return buffer.pop(0)
    i = rng.randrange(len(buffer))
    buffer[i], buffer[-1] = buffer[-1], buffer[i]
    return buffer.pop()


class Rewound(NamedTuple):
    """Where an epoch stands after ``n`` samples: positions ``(slice, j)`` still in the
    buffer (in buffer order), the interleave state, and whether the interleave is done."""

    buffer: list[tuple[int, int]]
    interleave: Interleave
    done: bool


def rewind(
    lengths: Sequence[int],
    width: int,
    rng: random.Random | None,
    size: int,
    n: int,
    initial: int | None = None,
) -> Rewound:
    """Replays the first ``n`` steps of an epoch on positions, advancing ``rng`` as they did.

    Args:
        lengths: Samples in each slice, in plan order.
        width: Slices open at once.
        rng: The shuffle buffer's RNG, fresh for the epoch; left as after ``n`` draws.
        size: Shuffle buffer size (1 without ``rng``).
        n: Samples handed out (skipped ones included).
        initial: Samples in the buffer before the first draw (default ``size``).

    Raises:
        ValueError: The epoch has fewer than ``n`` samples.
    """
    inter = Interleave(len(lengths), width)
    buffer: list[tuple[int, int]] = []
    done = False
    initial = size if initial is None else initial
    for k in range(n):
        target = fill_target(size, initial, k)
        while not done and len(buffer) < target:
            s = inter.current()
            if s is None:
                done = True
            elif inter.taken[s] == lengths[s]:
                inter.ended()
            else:
                buffer.append((s, inter.taken[s]))
                inter.took()
        if not buffer:
            raise ValueError(f"yielded={n} is past the end of the epoch ({sum(lengths)} samples)")
        draw(buffer, rng)
    return Rewound(buffer, inter, done)
