"""One epoch of a ShardedSource: concurrent slice readers, consumed in a fixed order.

::

    launcher (plan order) ─► reader per slice ─► its own queue (≤ depth samples)
                                                      │ taken round robin (interleave)
                                                      ▼
                                  shuffle buffer (≤ shuffle_buffer) ─► __anext__

Readers fetch concurrently, but samples are *taken* in the interleave order, so the epoch's
order depends only on (seed, epoch, rank), never on which read finished first.

Bounds: at most ``shard_concurrency`` readers stream at once (``_reading``), and at most
``2 * shard_concurrency`` slices are started and not yet taken to their end (``_ahead``: the
open slots plus as many read ahead). So at most ``shuffle_buffer + (2 * depth + 2) *
shard_concurrency`` queue items are held: the buffer, the queues, and per streaming reader
one item waiting for room and one being assembled. An item is a sample, or a block of a
slice's rows (a Parquet row group: its rows are held decoded anyway).

Blocks: where the order is the slices' own (no shuffle buffer, one slice open), the loader
takes batches as slices of the blocks (``__asyncloader_take__``); otherwise a block's rows
are made ``ROWS_AT_ONCE`` at a time as they are taken one by one.

Liveness (also with an interleave ``width`` below ``concurrency``, where slices are read
ahead of their turn): the launcher starts slices in plan order, and the interleave takes them
in plan order, so every slice the consumer can wait on was launched before any slice read
ahead of it; the permits that could block its launch are held only by slices before it, which
the consumer has taken to their end (releasing ``_ahead``) and whose readers have finished
(releasing ``_reading``). So the slice waited on is always being read. Taking blocks
(``__asyncloader_take__``) waits on the same queues in the same order and ends a slice the
same way (``_end_slice`` releases its ``_ahead`` permit at its ``_END``), so the argument
holds for it too (tests/unit/sources/test_block_stream.py, on a virtual clock).

Structured: the readers are tasks of one TaskGroup owned by the launcher task; its first
error is handed to the consumer (whichever queue it waits on). Closing the stream cancels
the launcher and waits for it, so no reader outlives the epoch.

Resume (``start`` > 0, slice lengths known): :func:`rewind` replays the first ``start``
steps on positions; then the only reads are, per slice, from the first position still in
the buffer (or, for an open slice, where the interleave stopped taking) on: samples before
the needed ones are read past without decoding, and a slice whose samples all went out
before ``start`` is not read at all. Without lengths, the epoch is read from its start and
the first ``start`` samples dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asyncloader._base import RowBlock, joined, unwrap_group
from asyncloader.sources._sharded.interleave import Interleave, draw, fill_target, rewind
from asyncloader.sources._sharded.remainder import StreamCut
from asyncloader.sources._sharded.shardplan import Slice

DEPTH = 2
#: Rows of a block made into Python objects at once when samples are taken one at a time
#: (about 1 ms of the loop's time for rows of a few hundred values).
ROWS_AT_ONCE = 128
SKIPPED_POSITION = (
    object()
)  # a position whose sample was skipped (on_error="skip"): counted, not given
_END = object()
_MISSING = object()

Items = Callable[[Slice, Callable[[int], bool]], AsyncGenerator[tuple[int, Any], None]]


@dataclass
class Position:
    """Where the consumer is in an epoch: ``yielded`` samples (skipped ones included)."""

    epoch: int
    rank: int
    world_size: int
    yielded: int = 0
    #: Samples in the shuffle buffer before its first draw (None: a full buffer).
    initial: int | None = None
    #: How a worker's part of the rank was chosen (see ``shardplan.plan``): ``"samples"``
    #: (equal sample counts) or ``"slices"`` (every n-th slice, before shard counts).
    worker_split: str = "samples"
    #: How the ranks' shares end when they do not divide evenly: ``"drop"`` or ``"pad"``.
    tail: str = "drop"
    #: The epoch's interruptions at other world sizes, oldest first: this pass is over what
    #: they left (see :mod:`.remainder`); empty for a whole epoch.
    history: list[StreamCut] = field(default_factory=list)


class _Run:
    """A block of rows being taken from: made into rows ``ROWS_AT_ONCE`` at a time by
    :meth:`next_row`, or sliced off whole by :meth:`take`. ``made[at:]`` come before
    ``block[start:]``."""

    __slots__ = ("at", "block", "made", "start")

    def __init__(self, block: RowBlock) -> None:
        self.block, self.start = block, 0
        self.made: list[Any] = []
        self.at = 0

    def left(self) -> int:
        return len(self.made) - self.at + len(self.block) - self.start

    def next_row(self) -> Any:
        if self.at == len(self.made):
            stop = min(self.start + ROWS_AT_ONCE, len(self.block))
            self.made, self.at = self.block.slice(self.start, stop).rows(), 0
            self.start = stop
        self.at += 1
        return self.made[self.at - 1]

    def take(self, most: int) -> RowBlock | list[Any]:
        """Up to ``most`` of the next rows: the made ones first (as rows), else a block."""
        if self.at < len(self.made):
            rows = self.made[self.at : self.at + most]
            self.at += len(rows)
            return rows
        stop = min(self.start + most, len(self.block))
        piece = self.block.slice(self.start, stop)
        self.start = stop
        return piece


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ShardStream:
    """One pass over a rank's slices, in the fixed order of :mod:`.interleave`.

    Args:
        slices: This rank's slices, in plan order.
        items: ``items(slice, want)`` yields ``(i, sample or SKIPPED_POSITION)`` for the slice's
            samples ``i`` with ``want(i)``, reading past (undecoded) the others.
        rng: The shuffle buffer's RNG, seeded from (seed, epoch, rank); None: no shuffling.
        buffer_size: Shuffle buffer size.
        concurrency: Slices read at once.
        position: Counts the samples handed out; its ``yielded`` is where this pass starts,
            its ``initial`` how full the buffer gets before the first draw (see
            :mod:`.interleave`).
        width: Slots of the interleave (default ``concurrency``); with fewer, the other
            slices read are read ahead of their turn.
        depth: Samples each slice's queue holds (``DEPTH`` by default); a deeper queue
            wakes its reader and the consumer once per ``depth`` samples, not per sample.

    Invariant: ``len(buffer) <= buffer_size``, each queue holds ``<= depth`` items (a
    sample, or a block of consecutive rows of its slice: see :class:`_Run`).
    """

    def __init__(
        self,
        slices: list[Slice],
        items: Items,
        rng: random.Random | None,
        buffer_size: int,
        concurrency: int,
        position: Position,
        width: int | None = None,
        depth: int = DEPTH,
    ) -> None:
        width = concurrency if width is None else width
        self._slices, self._items, self._rng = slices, items, rng
        self._depth = depth
        self._size = buffer_size if rng is not None else 1
        initial = position.initial
        self._initial = min(self._size, self._size if initial is None else initial)
        self.position = position
        self._drop = 0
        self._buffer: list[Any] = []
        self._done = False
        lengths = [s.take for s in slices if s.take is not None]
        if position.yielded and len(lengths) == len(slices):
            back = rewind(lengths, width, rng, self._size, position.yielded, self._initial)
            self._inter, self._done = back.interleave, back.done
            self._wanted = {pos: i for i, pos in enumerate(back.buffer)}
            self._buffer = [_MISSING] * len(back.buffer)
        else:  # from the start; without lengths, replay and drop what went out before
            self._inter, self._wanted = Interleave(len(slices), width), {}
            self._drop, position.yielded = position.yielded, 0
        self._missing = len(self._wanted)
        # Where each slice's reader starts: its first buffered position, else where the
        # interleave stopped taking (0 for unopened slices).
        starts: dict[int, int] = dict(self._inter.taken)
        for s, j in self._wanted:
            starts[s] = min(starts.get(s, j), j)
        self._refills = [
            (s, first, max(j for (t, j) in self._wanted if t == s))
            for s, first in sorted(starts.items())
            if s not in self._inter.taken
        ]
        self._starts = starts
        self._filled = asyncio.Event()
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._reading = asyncio.Semaphore(concurrency)
        self._ahead = asyncio.Semaphore(2 * concurrency)
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._runs: dict[int, _Run] = {}  # per slice, the block its samples come from now

    def __aiter__(self) -> ShardStream:
        return self

    def _queue(self, s: int) -> asyncio.Queue[Any]:
        if s not in self._queues:
            self._queues[s] = asyncio.Queue(self._depth)
        return self._queues[s]

    async def _read(self, s: int, first: int, feeds: int | None, last: int | None) -> None:
        """Reads slice ``s`` from its sample ``first`` to ``last`` (None: its end): buffered
        positions go to the buffer, samples from ``feeds`` on (None: none) to the slice's
        queue, the rest are read past."""
        slc = self._slices[s]
        if last is not None:
            slc = slc._replace(skip=slc.skip + first, take=last + 1 - first)
        elif first:
            take = None if slc.take is None else slc.take - first
            slc = slc._replace(skip=slc.skip + first, take=take)

        def want(i: int) -> bool:
            j = first + i
            return (s, j) in self._wanted or (feeds is not None and j >= feeds)

        try:
            async with contextlib.aclosing(self._items(slc, want)) as items:
                async for i, item in items:
                    j = first + i
                    if isinstance(item, RowBlock):
                        await self._place_block(s, j, item, feeds)
                    else:
                        await self._place(s, j, item, feeds)
        finally:
            self._reading.release()
        if feeds is not None:
            await self._queue(s).put(_END)

    async def _place(self, s: int, j: int, item: Any, feeds: int | None) -> None:
        """Sample ``j`` of slice ``s``: into the buffer where a resume left its position
        there, onto the slice's queue from ``feeds`` on, else read past."""
        if (s, j) in self._wanted:
            self._buffer[self._wanted.pop((s, j))] = item
            self._missing -= 1
            if not self._missing:
                self._filled.set()
        elif feeds is not None and j >= feeds:
            await self._queue(s).put(item)

    async def _place_block(self, s: int, j: int, block: RowBlock, feeds: int | None) -> None:
        """Samples ``j .. j + len(block) - 1`` of slice ``s``, given as one block: row by
        row while a resume still waits for buffered positions, else the part from ``feeds``
        on as one queue item."""
        if self._wanted:
            for t, row in enumerate(block.rows()):
                await self._place(s, j + t, row, feeds)
            return
        cut = 0 if feeds is None else max(feeds - j, 0)
        if feeds is not None and cut < len(block):
            await self._queue(s).put(block if not cut else block.slice(cut, len(block)))

    async def _launch(self) -> None:
        inter = self._inter
        try:
            async with asyncio.TaskGroup() as tg:
                for s, first, last in self._refills:
                    await self._reading.acquire()
                    tg.create_task(self._read(s, first, None, last), name=f"shard-refill:{s}")
                for s in [*sorted(inter.taken), *range(inter.next_slice, inter.n)]:
                    feeds = inter.taken.get(s, 0)
                    await self._ahead.acquire()
                    await self._reading.acquire()
                    read = self._read(s, self._starts.get(s, 0), feeds, None)
                    tg.create_task(read, name=f"shard-reader:{s}")
        except BaseExceptionGroup as group:
            self._fail(unwrap_group(group))
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Hands the error to the consumer, whichever queue (or the refill) it waits on."""
        self._failure = exc
        self._filled.set()
        for queue in self._queues.values():
            if not queue.full():
                queue.put_nowait(_Failed(exc))

    def _check(self) -> None:
        if self._failure is not None:
            self._done, self._missing = True, 0
            self._buffer.clear()
            raise self._failure

    async def _take(self, s: int) -> Any:
        """Slice ``s``'s next queue item: a sample, a block of rows, or ``_END``."""
        queue = self._queue(s)
        if queue.empty():
            self._check()
        item = await queue.get()
        if isinstance(item, _Failed):
            self._check()
        return item

    async def _next(self, s: int) -> Any:
        """Slice ``s``'s next sample (or ``_END``), one row at a time out of a block."""
        run = self._runs.get(s)
        if run is None:
            item = await self._take(s)
            if not isinstance(item, RowBlock):
                return item
            run = self._runs[s] = _Run(item)
        row = run.next_row()
        if not run.left():
            del self._runs[s]
        return row

    async def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._launch(), name="shards")
        if self._missing:
            await self._filled.wait()
            self._check()

    async def __asyncloader_take__(self, n: int) -> list[Any] | RowBlock:
        """The next ``n`` samples (fewer at the end); blocks of rows are sliced and joined,
        not made into rows, where the order is the slices' own (no shuffle buffer, one slice
        open at a time). See :mod:`asyncloader._base.row_block`."""
        if self._rng is not None or len(self._inter.slots) > 1 or self._drop:
            taken = []
            for _ in range(n):
                try:
                    taken.append(await self.__anext__())
                except StopAsyncIteration:
                    break
            return taken
        await self._start()
        inter, position = self._inter, self.position
        pieces: list[Any] = []
        got = 0
        while got < n:
            s = inter.current()
            if s is None:
                self._done = True
                break
            run = self._runs.get(s)
            if run is None:
                item = await self._take(s)
                if item is _END:
                    self._end_slice(s)
                elif item is SKIPPED_POSITION:
                    position.yielded += 1
                    inter.took()
                elif not isinstance(item, RowBlock):
                    pieces.append([item])
                    got += 1
                    position.yielded += 1
                    inter.took()
                else:
                    self._runs[s] = _Run(item)
                continue
            piece = run.take(n - got)
            if not run.left():
                del self._runs[s]
            pieces.append(piece)
            got += len(piece)
            position.yielded += len(piece)
            inter.took(len(piece))
        return joined(pieces) if pieces else []

    def _end_slice(self, s: int) -> None:
        self._inter.ended()
        del self._queues[s]
        self._ahead.release()

    async def __anext__(self) -> Any:
        await self._start()
        inter = self._inter
        while True:
            # position.yielded counts this epoch's draws, also those a replay drops
            target = fill_target(self._size, self._initial, self.position.yielded)
            while not self._done and len(self._buffer) < target:
                s = inter.current()
                if s is None:
                    self._done = True
                    break
                item = await self._next(s)
                if item is _END:
                    self._end_slice(s)
                else:
                    self._buffer.append(item)
                    inter.took()
            if not self._buffer:
                raise StopAsyncIteration
            item = draw(self._buffer, self._rng)
            self.position.yielded += 1
            if item is SKIPPED_POSITION or self._drop:
                self._drop = max(self._drop - 1, 0)
                continue
            return item

    async def aclose(self) -> None:
        """Cancels the readers and waits for them. Idempotent."""
        task, self._task = self._task, None
        self._done = True
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise


class AfterCounting:
    """An epoch's stream that first counts the shards' samples (see ``count_samples``)."""

    def __init__(
        self, count: Callable[[], Awaitable[Any]], stream: Callable[[], ShardStream]
    ) -> None:
        self._count, self._make = count, stream
        self._stream: ShardStream | None = None

    def __aiter__(self) -> AfterCounting:
        return self

    async def _ready(self) -> ShardStream:
        if self._stream is None:
            await self._count()
            self._stream = self._make()
        return self._stream

    async def __anext__(self) -> Any:
        return await (await self._ready()).__anext__()

    async def __asyncloader_take__(self, n: int) -> list[Any] | RowBlock:
        return await (await self._ready()).__asyncloader_take__(n)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
