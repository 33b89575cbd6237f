"""The virtual clock's own contracts: a hang is reported with every task's stack, taken while
the hang is still intact, whether or not a timer keeps the loop busy."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.virtual_clock import Stuck, VirtualClockLoop, deadline, virtual_time


async def _tick_for_ever() -> None:
    while True:
        await asyncio.sleep(0.5)  # a timer on the virtual clock: the loop never goes idle


def test_a_run_past_its_deadline_raises_stuck_with_the_stacks_before_cancelling():
    """A task stuck on a wake-up that never comes, beside a timer that keeps firing (so the
    loop never goes idle): the deadline names the stuck task and where it waits, taken before
    the cleanup that would cancel it ran."""
    with virtual_time(VirtualClockLoop()) as loop:

        async def main() -> None:
            never = asyncio.Event()
            ticker = asyncio.create_task(_tick_for_ever(), name="ticker")
            stuck = asyncio.create_task(never.wait(), name="lost-wake-up")
            try:
                async with deadline(30.0):
                    await stuck
            finally:  # what a loader's shutdown does: everything is cancelled
                ticker.cancel()
                stuck.cancel()
                await asyncio.gather(ticker, stuck, return_exceptions=True)

        with pytest.raises(Stuck) as info:
            loop.run_until_complete(main())
    text = str(info.value)
    assert "past its bound of 30.000 s" in text
    assert "--- lost-wake-up" in text and "--- ticker" in text
    assert "in wait" in text  # the stuck task's frame, not a cancelled one
    assert isinstance(info.value.__cause__, TimeoutError)


def test_a_run_that_ends_in_time_is_untouched():
    """Inside its bound the block returns its value and leaves no timer behind: nothing fires
    (an expiry after the block would report an error to the loop's handler)."""
    with virtual_time(VirtualClockLoop()) as loop:
        reported: list[dict] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))

        async def main() -> int:
            async with deadline(10.0):
                await asyncio.sleep(9.0)  # virtual seconds: the clock jumps
            await asyncio.sleep(5.0)  # past the old bound: nothing fires
            return 7

        assert loop.run_until_complete(main()) == 7
        assert loop.time() == pytest.approx(14.0)
        assert reported == []


def test_a_timeout_of_the_blocks_own_is_not_taken_for_a_hang():
    """A ``TimeoutError`` the block raises itself passes through as it is."""
    with virtual_time(VirtualClockLoop()) as loop:

        async def main() -> None:
            async with deadline(100.0):
                async with asyncio.timeout(1.0):
                    await asyncio.sleep(5.0)

        with pytest.raises(TimeoutError):
            loop.run_until_complete(main())


def test_every_task_waiting_with_no_timer_is_stuck_at_once():
    """With no timer at all, the loop itself raises :class:`Stuck` (no deadline needed)."""
    with (
        virtual_time(VirtualClockLoop(idle_s=0.01)) as loop,
        pytest.raises(Stuck, match="every task waits and no timer is set"),
    ):
        loop.run_until_complete(asyncio.Event().wait())
