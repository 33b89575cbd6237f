"""ReorderBuffer: release order, end of stream, failure."""

import asyncio
import random

import pytest

from asyncloader._base.reorder import ReorderBuffer


async def drain(buf: ReorderBuffer) -> list[int]:
    out = []
    while True:
        try:
            seq, item = await buf.get()
        except StopAsyncIteration:
            return out
        assert item == f"batch{seq}"
        out.append(seq)


@pytest.mark.asyncio
@pytest.mark.parametrize("in_order", [True, False])
async def test_releases_every_seq_once_in_the_right_order(in_order):
    """Completion order is shuffled; in order releases 0..n-1, else completion order."""
    n = 50
    completion = list(range(n))
    random.Random(1).shuffle(completion)
    buf = ReorderBuffer(in_order)
    consumer = asyncio.create_task(drain(buf))
    for seq in completion:
        buf.put(seq, f"batch{seq}")
        await asyncio.sleep(0)  # let the consumer take what it can, as a real pipeline would
    buf.finish(n)
    released = await consumer
    assert released == (list(range(n)) if in_order else completion)


@pytest.mark.asyncio
async def test_in_order_holds_later_batches_until_the_missing_one_arrives():
    """With seq 0 missing, nothing is released; once it arrives, 0,1,2 come out at once."""
    buf = ReorderBuffer(True)
    buf.put(2, "batch2")
    buf.put(1, "batch1")
    getter = asyncio.create_task(buf.get())
    seen = {}

    def arrive() -> None:  # runs after the getter's first step (the loop runs them in order)
        seen.update(done=getter.done(), held=len(buf), next=buf.next_seq)
        buf.put(0, "batch0")

    asyncio.get_running_loop().call_soon(arrive)
    assert await getter == (0, "batch0")
    assert seen == {"done": False, "held": 2, "next": 0}
    assert await buf.get() == (1, "batch1")
    assert await buf.get() == (2, "batch2")


@pytest.mark.asyncio
async def test_finish_with_nothing_pending_ends_the_stream():
    """finish(0) ends an empty stream; get raises StopAsyncIteration, repeatedly."""
    buf = ReorderBuffer(True)
    buf.finish(0)
    for _ in range(2):
        with pytest.raises(StopAsyncIteration):
            await buf.get()


@pytest.mark.asyncio
async def test_fail_wakes_a_waiting_consumer_with_the_error():
    """A consumer blocked in get() receives the error passed to fail()."""
    buf = ReorderBuffer(True)
    getter = asyncio.create_task(buf.get())
    seen = {}

    def fail() -> None:  # runs after the getter's first step, which leaves it waiting
        seen["waiting"] = not getter.done()
        buf.fail(KeyError("boom"))

    asyncio.get_running_loop().call_soon(fail)
    with pytest.raises(KeyError, match="boom"):
        await getter
    assert seen == {"waiting": True}


@pytest.mark.asyncio
async def test_a_resumed_buffer_starts_late_and_steps_over_skipped_seqs():
    """start=5, skip={7}: in order it releases 5, 6, 8, 9 and then ends."""
    buf = ReorderBuffer(True, start=5, skip=frozenset({7}))
    for seq in (9, 8, 6, 5):
        buf.put(seq, f"batch{seq}")
    buf.finish(4)
    assert await drain(buf) == [5, 6, 8, 9]
