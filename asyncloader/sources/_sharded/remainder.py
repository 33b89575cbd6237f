"""What an epoch interrupted at one world size had left, for the ranks of another to split.

Rule (the same on every rank, from the state alone, so the new ranks agree without talking):
an epoch starts as the sequence of its shards' samples laid end to end in the epoch's shard
order (:mod:`.shardplan`). A :class:`StreamCut` records an interruption: the world size then and,
per worker, the samples each of a rank's streams had handed out (every rank's worker ``w``
holds the same count and the ranks step together, so one rank's counts are every rank's).
Replaying every old stream on positions (:func:`.interleave.rewind`) says which samples it
had handed out: those taken by its interleave and no longer in its shuffle buffer. The
*remainder* is the sequence without them, in the same order; a sample a padded tail gave
twice is gone once either copy went out. The new ranks split the remainder as a fresh epoch
is split, with their own tail, into slices that pick a shard's remaining indices (read past
the others, see ``ShardedSource.items``). A second interruption cuts the remainder again:
``history`` lists the epoch's cuts, oldest first, which is all it takes to rebuild it.

So nothing handed out before a cut comes again after it, and everything that comes after it
was in the remainder: with ``"drop"``, each sample at most once and fewer than the new world
size left out; with ``"pad"``, every remaining sample at least once.

Cost: the replay walks every old stream's handed-out positions once (no data is read), on
every new rank and worker: one pass over the epoch's positions per cut.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asyncloader.sources._sharded.interleave import rewind
from asyncloader.sources._sharded.shardplan import Run, Slice, check_tail, split

#: ``rng(rank, worker, workers, cuts)``: the shuffle RNG of that stream of an epoch already cut
#: ``cuts`` times (None without shuffling).
RngFor = Callable[[int, int, int, int], random.Random | None]


@dataclass(frozen=True)
class StreamCut:
    """One interruption of an epoch: every rank of ``world_size`` had handed out
    ``yielded[w]`` samples from its worker ``w``'s stream (one stream: one worker), whose
    order followed ``initial`` (the buffer's first fill), ``worker_split`` and ``tail``."""

    world_size: int
    yielded: tuple[int, ...]
    initial: int
    worker_split: str
    tail: str

    def as_state(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "yielded": list(self.yielded),
            "shuffle_initial": self.initial,
            "worker_split": self.worker_split,
            "distributed_tail": self.tail,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> StreamCut:
        """Raises ValueError when ``state`` (a ``history`` entry) is not one."""
        try:
            cut = cls(
                int(state["world_size"]),
                tuple(int(y) for y in state["yielded"]),
                int(state["shuffle_initial"]),
                str(state["worker_split"]),
                str(state["distributed_tail"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"state history entry {dict(state)!r} is not a cut") from exc
        check_tail(cut.tail)
        if cut.world_size < 1 or not cut.yielded or min(cut.yielded) < 0:
            raise ValueError(f"state history entry {dict(state)!r} is not a cut")
        return cut


@dataclass(frozen=True)
class Streams:
    """What fixes a stream's order besides its slices: slices read at once, the shuffle
    buffer's size (1 without shuffling) and the RNG of each stream."""

    width: int
    size: int
    rng: RngFor


def stream_slices(
    runs: Sequence[Run], rank: int, world: int, worker: int, workers: int, split_rule: str,
    tail: str,
) -> list[Slice]:  # fmt: skip
    """The slices of one stream: its rank's share, then its worker's part of it, by sample
    counts (``"samples"``) or every ``workers``-th slice (``"slices"``, see ``shardplan``)."""
    if split_rule == "slices":
        return split(runs, rank, world, 0, 1, tail)[worker::workers]
    return split(runs, rank, world, worker, workers, tail)


def remainder_plan(
    counts: Sequence[int],
    order: Sequence[int],
    history: Sequence[StreamCut],
    streams: Streams,
    where: tuple[int, int, int, int],
    split_rule: str,
    tail: str,
) -> list[Slice]:
    """The slices of the stream ``where = (rank, world, worker, workers)`` over what the
    epoch (shards ``order`` of ``counts``) had left after the cuts of ``history``."""
    runs = [Run(shard, counts[shard]) for shard in order]
    for cuts, cut in enumerate(history):
        runs = remainder(runs, cut, streams, cuts)
    return stream_slices(runs, *where, split_rule, tail)


def remainder(runs: Sequence[Run], cut: StreamCut, streams: Streams, cuts: int) -> list[Run]:
    """What ``runs`` (the epoch cut ``cuts`` times already) had left after ``cut``.

    Raises:
        ValueError: A stream of ``cut`` handed out more samples than it holds.
    """
    gone = {run.shard: bytearray(max(run.indices(), default=-1) + 1) for run in runs}
    workers = len(cut.yielded)
    initial = min(cut.initial, streams.size)
    for rank in range(cut.world_size):
        for worker, yielded in enumerate(cut.yielded):
            slices = stream_slices(
                runs, rank, cut.world_size, worker, workers, cut.worker_split, cut.tail
            )
            rng = streams.rng(rank, worker, workers, cuts)
            lengths = [s.take or 0 for s in slices]
            back = rewind(lengths, streams.width, rng, streams.size, yielded, initial)
            held = set(back.buffer)
            inter = back.interleave
            for s, slc in enumerate(slices):
                if s in inter.taken:
                    taken = inter.taken[s]
                else:
                    taken = lengths[s] if s < inter.next_slice else 0
                for j in range(taken):
                    if (s, j) not in held:
                        gone[slc.shard][slc.sample(j)] = 1
    left = []
    for run in runs:
        marks = gone[run.shard]
        picks = tuple(i for i in run.indices() if not marks[i])
        if picks:
            left.append(Run(run.shard, len(picks), picks))
    return left


def cut_of(
    states: Sequence[Mapping[str, Any] | None], buffer_size: int
) -> tuple[Mapping[str, Any], StreamCut]:
    """The cut that the states of one rank's streams (in worker order; None: a worker that has
    handed out nothing yet) describe, and one of those states. A state without
    ``shuffle_initial`` predates it: its buffer (``buffer_size``) filled before the first draw.

    Raises:
        ValueError: No state is given, or they disagree on what their order follows.
    """
    known = [s for s in states if s is not None]
    if not known:
        raise ValueError("states holds no stream's state")
    first = known[0]
    for state in known[1:]:
        for name in ("epoch", "world_size", "shuffle_initial", "worker_split", "history"):
            if state.get(name) != first.get(name):
                raise ValueError(
                    f"the workers' states disagree on {name}: {first.get(name)!r} and "
                    f"{state.get(name)!r}; they must come from one state_dict() of the loader"
                )
    tail = str(first.get("distributed_tail", "drop"))
    check_tail(tail)
    yielded = tuple(int(s["yielded"]) if s is not None else 0 for s in states)
    initial = min(int(first.get("shuffle_initial", buffer_size)), buffer_size)
    split_rule = str(first.get("worker_split", "slices"))
    return first, StreamCut(int(first["world_size"]), yielded, initial, split_rule, tail)


def moved_state(
    states: Sequence[Mapping[str, Any] | None],
    buffer_size: int,
    rank: int,
    world_size: int,
    initial: int,
    tail: str,
) -> dict[str, Any]:
    """The state (``ShardedSource.state_dict()``'s form) of a new stream at the start of what
    the streams that saved ``states`` (see :func:`cut_of`) left, one cut more: it follows
    this source's ``initial`` and ``tail``, and splits workers by sample counts."""
    first, cut = cut_of(states, buffer_size)
    history = [StreamCut.from_state(c) for c in first.get("history", ())]
    if any(cut.yielded):  # nothing handed out: nothing to cut
        history.append(cut)
    return {
        "epoch": int(first["epoch"]),
        "yielded": 0,
        "rank": rank,
        "world_size": world_size,
        "shuffle_initial": initial,
        "worker_split": "samples",
        "distributed_tail": tail,
        "history": [c.as_state() for c in history],
    }


async def read_picks(
    items: Callable[[Slice, Callable[[int], bool]], AsyncGenerator[tuple[int, Any], None]],
    slc: Slice,
    want: Callable[[int], bool],
) -> AsyncGenerator[tuple[int, Any], None]:
    """``items(slc, want)`` of a slice with ``picks``, through ``items`` of consecutive
    samples: the shard is read from the first pick to the last, past the others."""
    assert slc.picks is not None and slc.take is not None  # picks always have a length
    picks = slc.picks[slc.skip : slc.skip + slc.take]
    first = picks[0]
    place = {index - first: k for k, index in enumerate(picks)}
    span = Slice(slc.shard, first, picks[-1] + 1 - first)
    read = items(span, lambda i: i in place and want(place[i]))
    async with contextlib.aclosing(read) as samples:
        async for i, item in samples:
            yield place[i], item
