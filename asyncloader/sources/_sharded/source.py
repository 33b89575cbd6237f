"""ShardedSource: streams WebDataset-style tar shards as an async iterable source.

::

    plan (this rank's slices, seed + epoch) ─► shard readers (≤ shard_concurrency at once)
        each: ranged stream ─► tar members ─► samples (grouped by key) ─► decode
                                        │ a queue per slice (≤ depth samples), taken
                                        ▼ round robin in plan order (.interleave)
                         shuffle buffer (≤ shuffle_buffer samples) ─► loader

The order depends only on (seed, epoch, rank), so :meth:`ShardedSource.load_state_dict`
can resume an epoch exactly; at another world size, the new ranks split what the old ones
had left (:mod:`.remainder`). Memory bound: at most ``shuffle_buffer + (2 * depth + 2) *
shard_concurrency`` samples are held (see :mod:`.stream`), plus one chunk per reader.
A reader whose stream breaks resumes at the tar header after the last whole member (a Range
read), so no member is lost or read twice; see :mod:`.._retry` for the budget.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asyncloader._base import check_ranks, get_worker_info, resolve_ranks
from asyncloader.sources._cache.client import plan_cache, with_cache
from asyncloader.sources._map import DEFAULT_MAX_OBJECT_SIZE, check_common
from asyncloader.sources._redact import redact_url
from asyncloader.sources._retry import Retry
from asyncloader.sources._sharded.options import checked_arguments, make_client
from asyncloader.sources._sharded.reading import ShardReading
from asyncloader.sources._sharded.remainder import StreamCut, Streams, moved_state, remainder_plan
from asyncloader.sources._sharded.shardplan import (
    Slice,
    check_tail,
    plan,
    samples_per_rank,
    shard_order,
)
from asyncloader.sources._sharded.stream import DEPTH, AfterCounting, Position, ShardStream
from asyncloader.sources._skips import Skips

if TYPE_CHECKING:
    from asyncloader.sources._cache.disk_cache import DiskCache


def _worker_part() -> tuple[int, int]:
    """``(worker id, workers)`` inside a worker iterating its own copy, else ``(0, 1)``."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class ShardedSource(ShardReading):
    """An async iterable of samples from tar shards: dicts ``{"__key__", "__url__", ext: bytes}``
    (or ``decode(dict)``).

    Args:
        shard_urls: Tar shards: ``http(s)://`` URLs, fsspec URLs (``s3://...``), or local paths.
        samples_per_shard: Samples in each shard: one per shard, or one int, which every
            shard holds but the last, which holds at most that many (as
            ``webdataset.ShardWriter(maxcount=...)`` leaves them); the last shard is then
            counted (read once, see :meth:`count_samples`) before the first iteration.
            Splitting shards across ranks with equal counts (see below) needs them: without,
            each rank counts them on its first epoch by reading every shard once. ``len()``
            needs them too. A shard holding fewer or more than declared raises FetchError.
        seed: Seeds the shard order and the shuffle buffer; the same on every rank.
        shuffle: Shuffle the shard order each epoch (and samples, with ``shuffle_buffer``).
        shuffle_buffer: Samples held to shuffle among (1: no sample shuffling).
        shuffle_initial: Samples in the buffer before the first one goes out (default
            ``min(100, shuffle_buffer)``); the buffer then grows by one per sample until it
            holds ``shuffle_buffer``, as webdataset's ``initial``. So the first batch comes
            after about one shard's fetch, not after ``shuffle_buffer`` samples; the first
            samples of an epoch are shuffled among fewer. ``shuffle_initial=shuffle_buffer``
            waits for a full buffer.
        shard_concurrency: Shards read at once; their samples are taken in turn, in plan
            order, so the order depends on seed, epoch and rank only, never on timing.
        rank, world_size: This process's place among the ranks; default torch.distributed's
            when initialised, else a single rank.
        distributed_tail: When the samples (of an epoch, or what an interrupted one had left)
            do not split evenly across ranks: ``"drop"`` (default) leaves fewer than
            ``world_size`` out, each sample at most once; ``"pad"`` repeats the head to make
            equal shares, every sample at least once, fewer than ``world_size`` twice.
        decode: ``fn(sample dict) -> sample``, run on the event loop.
        storage_options, headers, timeout, retry, max_connections: As for
            :class:`ObjectStoreSource` and :class:`HTTPSource`.
        on_error: ``"raise"`` (default), or ``"skip"``: a shard that fails for good skips its
            remaining samples, a sample ``decode`` rejects is skipped; each is counted in
            ``skipped`` (needs ``samples_per_shard``). A rank that skips yields fewer samples.
        max_skipped: The most samples to skip with ``on_error="skip"``.
        max_object_size: Largest tar member accepted, in bytes (default 256 MiB).
        cache: A :class:`DiskCache`: a shard is read from it when there, else downloaded
            into it whole (once per node), then read from it; the shards of the running
            epoch are evicted last (see docs/sources.md, "Disk cache").

    Call :meth:`set_epoch` before each epoch (as with DistributedSampler) for a new order;
    ``AsyncLoader(distributed=True)`` calls it, and :meth:`set_rank`, itself.

    Rank rule: shards are shuffled with ``seed`` and the epoch, laid end to end, and rank
    ``r`` takes samples ``[r * per, (r + 1) * per)`` with ``per = total // world_size``: equal
    counts, no sample on two ranks, at most ``world_size - 1`` left out per epoch (with
    ``distributed_tail="pad"``, ``per`` rounds up and the head is repeated instead).
    """

    def __init__(
        self,
        shard_urls: Sequence[str],
        /,
        *,
        samples_per_shard: int | Sequence[int] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        shuffle_initial: int | None = None,
        shard_concurrency: int = 4,
        rank: int | None = None,
        world_size: int | None = None,
        distributed_tail: str = "drop",
        decode: Callable[[dict[str, Any]], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        cache: DiskCache | None = None,
        timeout: float = 30.0,
        retry: Retry | None = None,
        on_error: str = "raise",
        max_skipped: int | None = None,
        max_object_size: int | None = DEFAULT_MAX_OBJECT_SIZE,
        max_connections: int | None = None,
    ) -> None:
        retry = check_common(retry, max_object_size, None, cache)
        self._urls, counts, shuffle_initial = checked_arguments(
            shard_urls,
            samples_per_shard,
            decode,
            (shuffle_buffer, shard_concurrency, shuffle_initial),
            (rank, world_size),
            distributed_tail,
            on_error,
        )
        # The shards' counts when known. One int: every shard holds that many but the last,
        # which holds at most that many (``_at_most``) and is counted before an iteration.
        self._counts: list[int] | None = counts
        self._at_most: int | None = None
        if isinstance(samples_per_shard, int):
            self._counts, self._at_most = None, samples_per_shard
        self._skips = Skips(on_error, max_skipped)
        client = make_client(
            self._urls[0],
            timeout=timeout,
            headers=headers,
            max_connections=max_connections,
            max_object_size=max_object_size,
            storage_options=storage_options,
        )
        self._client = with_cache(client, cache)
        self._seed, self._shuffle, self._epoch = seed, bool(shuffle), 0
        self._buffer_size, self._concurrency = shuffle_buffer, shard_concurrency
        #: Slices whose samples are taken in turn (see .interleave); read ahead: _concurrency.
        self._width = shard_concurrency
        self._depth = DEPTH  # samples queued per slice read (see .stream)
        self._initial = shuffle_initial
        self._rank, self._world, self._tail = rank, world_size, distributed_tail
        self._decode, self._retry = decode, retry
        self._max_member = max_object_size
        self._position: Position | None = None  # of the current (or a loaded) iteration
        self._loaded = False  # the next iteration starts at the loaded position

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a worker process keeps this process's place among the ranks: the
        worker has no torch.distributed group to ask."""
        state = self.__dict__.copy()
        if self._rank is None:
            state["_rank"], state["_world"] = resolve_ranks(None, None)
        return state

    def set_rank(self, rank: int, world_size: int) -> None:
        """Sets this source's place among the ranks (``AsyncLoader(distributed=True)`` calls
        it). Raises ValueError when it was built for another place."""
        check_ranks(rank, world_size)
        if self._rank is not None and (self._rank, self._world) != (rank, world_size):
            raise ValueError(
                f"this ShardedSource was built for rank {self._rank} of {self._world}, the "
                f"loader is rank {rank} of {world_size}"
            )
        self._rank, self._world = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the next iteration's shard order and sample shuffle; the
        next iteration starts at the epoch's beginning (a loaded state is dropped)."""
        self._epoch = int(epoch)
        self._position, self._loaded = None, False

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the epoch: ``{"epoch", "yielded", "rank", "world_size",
        "shuffle_initial", "worker_split", "distributed_tail", "history"}``.

        ``yielded`` counts the samples handed out by the current (or next) iteration,
        skipped ones included; ``shuffle_initial``, ``worker_split`` and ``distributed_tail``
        are the rules that iteration's order follows; ``history`` lists the epoch's
        interruptions at other world sizes (see :mod:`.remainder`), whose remainder the
        iteration goes over. Valid between any two samples; JSON-friendly.
        """
        pos = self._position
        if pos is None:
            rank, world = resolve_ranks(self._rank, self._world)
            pos = Position(self._epoch, rank, world, initial=self._initial, tail=self._tail)
        return {
            "epoch": pos.epoch,
            "yielded": pos.yielded,
            "rank": pos.rank,
            "world_size": pos.world_size,
            "shuffle_initial": pos.initial,
            "worker_split": pos.worker_split,
            "distributed_tail": pos.tail,
            "history": [cut.as_state() for cut in pos.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue ``state``'s epoch at its sample ``yielded``.

        The same world size: the order that follows is the one the uninterrupted epoch had.
        With ``samples_per_shard`` only what is still needed is read again (see
        :mod:`.stream`); without it, the epoch is read from its start and the first samples
        dropped. Ranks step together and every rank (and each of its workers) holds the same
        number of samples, so a state saved by any rank continues this rank's part of the
        epoch at the same place.

        Another world size (a state from a single iteration per rank): as
        ``load_state_dict(elastic_state([state]))``.

        Raises:
            ValueError: ``state`` is past the epoch's end, or is one worker's (of several) at
                another world size: it does not say where its rank's other workers were.
        """
        rank, world = resolve_ranks(self._rank, self._world)
        if int(state["world_size"]) != world:
            worker, workers = _worker_part()
            if workers > 1:
                raise ValueError(
                    f"state was saved by rank {state['rank']} of {state['world_size']}, this "
                    f"is worker {worker} of {workers} of rank {rank} of {world}: one stream's "
                    "position does not say where its rank's other workers were; load the "
                    "loader's state_dict() (or elastic_state() of every worker's state)"
                )
            state = self.elastic_state([state])
        history = [StreamCut.from_state(cut) for cut in state.get("history", ())]
        tail = str(state.get("distributed_tail", "drop"))  # before it, ranks always dropped
        check_tail(tail)
        yielded = int(state["yielded"])
        whole = (
            None if history or self._counts is None else samples_per_rank(self._counts, world, tail)
        )
        if yielded < 0 or (whole is not None and yielded > whole):
            raise ValueError(f"state yielded={yielded} is outside this rank's epoch")
        self._epoch = int(state["epoch"])
        # A state without shuffle_initial predates it: its buffer filled before the first draw.
        initial = min(int(state.get("shuffle_initial", self._buffer_size)), self._buffer_size)
        split = state.get("worker_split", "slices")  # before it, workers took every n-th slice
        self._position = Position(self._epoch, rank, world, yielded, initial, split, tail, history)
        self._loaded = True

    def elastic_state(self, states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        """The state with which this rank (every one of its workers) continues, at this
        source's world size, an epoch that a rank of another world size had reached.

        ``states`` are that rank's streams' :meth:`state_dict` s, one per worker with
        ``fetch_in_workers`` (in worker order; None for a worker that had handed out nothing),
        else one. Any rank's will do: every rank's worker ``w`` stands at the same place.
        ``AsyncLoader(distributed=True)`` calls this itself when it resumes at another world
        size. The epoch's rule (:mod:`.remainder`): the new ranks split what every old
        stream had not handed out, as a fresh epoch is split, with this source's
        ``distributed_tail``.

        Raises:
            ValueError: ``states`` is empty, or its states disagree on the epoch or the rules.
        """
        rank, world = resolve_ranks(self._rank, self._world)
        return moved_state(states, self._buffer_size, rank, world, self._initial, self._tail)

    def slices(self, worker: int = 0, workers: int = 1) -> list[Slice]:
        """The shard slices this rank (its worker ``worker`` of ``workers``) reads in the
        current epoch (what a loaded interrupted epoch had left), in reading order.

        Raises:
            ValueError: The split needs counts this source does not have yet (one int
                ``samples_per_shard``: the last shard's; none: every shard's, beyond one rank).
        """
        if self._counts is None and self._at_most is not None:
            raise ValueError(
                "the last shard's count is not known yet (samples_per_shard is one int: the "
                "last shard may hold fewer); await count_samples() first, which reads it"
            )
        pos = self._position
        tail, history = (pos.tail, pos.history) if pos is not None else (self._tail, [])
        return self._plan(worker, workers, "samples", tail, history)

    def _plan(
        self, worker: int, workers: int, split: str, tail: str, history: Sequence[StreamCut]
    ) -> list[Slice]:
        """A stream's slices: its part of this rank's share of the epoch, or of what
        ``history``'s interruptions left of it."""
        rank, world = resolve_ranks(self._rank, self._world)
        if not history:
            if split == "slices":  # every n-th slice of the rank's (counts may be unknown)
                return self._plan(0, 1, "samples", tail, history)[worker::workers]
            return plan(
                self._counts,
                len(self._urls),
                seed=self._seed,
                epoch=self._epoch,
                shuffle=self._shuffle,
                rank=rank,
                world_size=world,
                worker=worker,
                workers=workers,
                tail=tail,
            )
        if self._counts is None:
            raise ValueError(
                "samples_per_shard (or count_samples()) is needed to split what an "
                "interrupted epoch had left"
            )
        order = shard_order(len(self._urls), self._seed, self._epoch, self._shuffle)
        size = self._buffer_size if self._shuffle else 1
        streams = Streams(self._width, size, self._rng)
        where = (rank, world, worker, workers)
        return remainder_plan(self._counts, order, history, streams, where, split, tail)

    def _rng(self, rank: int, worker: int, workers: int, cuts: int) -> random.Random | None:
        """The shuffle buffer's RNG of a stream of the current epoch (None: no shuffling)."""
        if not self._shuffle:
            return None
        seed = f"{self._seed}:{self._epoch}:{rank}:samples"
        if workers > 1:
            seed += f":worker{worker}of{workers}"
        if cuts:
            seed += f":cut{cuts}"
        return random.Random(seed)

    def __len__(self) -> int:
        """Samples this rank yields per (whole) epoch (needs the shards' counts).

        With one int ``samples_per_shard``, until the last shard is counted (by this copy's
        first iteration, or :meth:`count_samples`), an upper bound: the last shard taken as
        full."""
        counts = self._counts
        if counts is None and self._at_most is not None:
            counts = [self._at_most] * len(self._urls)
        if counts is None:
            raise TypeError("len() of a ShardedSource needs samples_per_shard or count_samples()")
        return samples_per_rank(counts, resolve_ranks(self._rank, self._world)[1], self._tail)

    def __aiter__(self) -> AsyncIterator[Any]:
        """This rank's samples; inside a worker of ``fetch_in_workers=True``, only the worker's
        part (equal sample counts, see :mod:`.shardplan`), shuffled with its own RNG."""
        rank, world = resolve_ranks(self._rank, self._world)
        start, split, tail = 0, "samples", self._tail
        initial: int | None = self._initial
        history: list[StreamCut] = []
        if self._position is not None and self._loaded:
            pos = self._position
            start, initial, split, tail = pos.yielded, pos.initial, pos.worker_split, pos.tail
            history = list(pos.history)
        self._loaded = False
        position = Position(self._epoch, rank, world, start, initial, split, tail, history)
        self._position = position
        worker, workers = _worker_part()

        def stream() -> ShardStream:
            if workers > 1 and not history and self._counts is None:
                position.worker_split = "slices"
            slices = self._plan(worker, workers, position.worker_split, tail, history)
            plan_cache(self._client, [self._urls[s.shard] for s in slices])
            rng = self._rng(rank, worker, workers, len(history))
            return ShardStream(
                slices,
                self.items,
                rng,
                self._buffer_size,
                self._concurrency,
                position,
                self._width,
                self._depth,
            )

        if self._counts is None and self._counts_first(world, history):
            return AfterCounting(self.count_samples, stream)
        return stream()

    def _counts_first(self, world: int, history: Sequence[StreamCut]) -> bool:
        """Whether an iteration must count the shards' samples before its plan (the counts
        are not known yet): to split them across ranks, or what an epoch had left."""
        return self._at_most is not None or world > 1 or bool(history)

    async def count_samples(self) -> list[int]:
        """The samples in each shard, counted by reading every shard through once (a tar
        has no index), ``shard_concurrency`` at a time; kept, so this reads only once. With
        one int ``samples_per_shard``, only the last shard is read (the others hold that
        many).

        Splitting shards across ranks with equal sample counts needs them: without
        ``samples_per_shard``, each rank counts on its first iteration (in each worker, with
        ``fetch_in_workers``), reading the data once more; with one int, it reads the last
        shard. Save what this returns and pass it as ``samples_per_shard`` to skip that read
        (or call this before the loader starts its workers: their copies keep the counts).

        Raises:
            FetchError: A shard cannot be read, or holds more than one int
                ``samples_per_shard`` says.
        """
        if self._counts is None:
            n, most = len(self._urls), self._at_most
            if most is None:
                self._counts = await self._count(range(n))
            else:
                self._counts = [most] * (n - 1) + await self._count([n - 1])
        return list(self._counts)

    def __repr__(self) -> str:
        first = redact_url(self._urls[0])
        return f"ShardedSource(<{len(self._urls)} shards: {first}, ...>, {self._client!r})"
