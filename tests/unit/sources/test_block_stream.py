"""ShardStream handing out blocks of rows, on a virtual clock over randomised schedules:
slices read ahead at random latencies, blocks of random sizes mixed with single samples and
skipped positions, a consumer that takes blocks and single rows in turn at random. Every
epoch ends, gives every sample once in order, and leaves no reader behind."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import pytest

from asyncloader._base import TAKE, RowBlock
from asyncloader.sources._sharded.shardplan import Slice
from asyncloader.sources._sharded.stream import SKIPPED_POSITION, Position, ShardStream
from tests.helpers.depth import scaled
from tests.helpers.virtual_clock import VirtualClockLoop, deadline, virtual_time


class ListRows(RowBlock):
    """A block over a list of rows."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def rows(self) -> list[Any]:
        return list(self.items)

    def slice(self, start: int, stop: int) -> ListRows:
        return ListRows(self.items[start:stop])

    @classmethod
    def concat(cls, blocks: Sequence[RowBlock]) -> ListRows:
        return ListRows([row for b in blocks for row in b.items])  # type: ignore[attr-defined]


def simulate(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randrange(0, 40) for _ in range(rng.randrange(1, 8))]
    skipped = {(s, j) for s, n in enumerate(lengths) for j in range(n) if rng.random() < 0.05}
    delays = random.Random(seed + 1)

    async def items(slc: Slice, want: Callable[[int], bool]) -> AsyncGenerator[Any, None]:
        i, n = 0, (slc.take if slc.take is not None else lengths[slc.shard] - slc.skip)
        while i < n:
            await asyncio.sleep(delays.uniform(0, 0.05))
            j = slc.skip + i
            if (slc.shard, j) in skipped:
                yield i, SKIPPED_POSITION
                i += 1
                continue
            size = min(n - i, delays.choice([1, 1, 3, 16, 64]))
            rows = [(slc.shard, slc.skip + i + t) for t in range(size)]
            if any((slc.shard, r[1]) in skipped for r in rows) or size == 1:
                yield i, rows[0]
                i += 1
            else:
                yield i, ListRows(rows)
                i += size

    slices = [Slice(s, 0, n) for s, n in enumerate(lengths)]
    stream = ShardStream(slices, items, None, 1, rng.randint(1, 4), Position(0, 0, 1), width=1)
    expected = [(s, j) for s, n in enumerate(lengths) for j in range(n) if (s, j) not in skipped]

    async def consume() -> list[Any]:
        got: list[Any] = []
        while True:
            await asyncio.sleep(rng.choice([0, 0, 0.01, 0.2]))
            if rng.random() < 0.7:
                block = await getattr(stream, TAKE)(rng.randint(1, 50))
                if not len(block):
                    return got
                got.extend(block.rows() if isinstance(block, RowBlock) else block)
            else:
                try:
                    got.append(await anext(stream))
                except StopAsyncIteration:
                    return got

    with virtual_time(VirtualClockLoop()) as loop:

        async def main() -> list[Any]:
            try:
                async with deadline(60 + 0.3 * sum(lengths)):
                    return await consume()
            finally:
                await stream.aclose()

        got = loop.run_until_complete(main())
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        assert not left, f"seed {seed}: {len(left)} tasks left"
    assert got == expected, f"seed {seed}"
    assert stream.position.yielded == sum(lengths), f"seed {seed}"


@pytest.mark.parametrize("block", range(4))
def test_blocks_and_rows_taken_in_turn_end_every_epoch_in_order(block):
    runs = scaled(200)
    for seed in range(block * runs, (block + 1) * runs):
        simulate(seed)
