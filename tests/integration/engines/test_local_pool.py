"""How worker processes are stopped: each gets the grace period, then SIGTERM, then SIGKILL,
DataLoader's order (:func:`asyncloader._engines.local_pool.stop_processes`)."""

from __future__ import annotations

import multiprocessing
import signal
import time

from asyncloader._engines.local_pool import stop_processes


def _deaf_to_sigterm(ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    signal.pause()  # returns on no signal: only SIGKILL ends it


def test_processes_past_the_grace_are_terminated_then_killed():
    """One process that exits in the grace period, one that only SIGTERM stops and one that
    ignores SIGTERM: all are gone after, each ended by the step that reached it."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    quick = ctx.Process(target=time.sleep, args=(0.05,))
    sleeper = ctx.Process(target=signal.pause)  # until a signal ends it
    deaf = ctx.Process(target=_deaf_to_sigterm, args=(ready,))
    for proc in (quick, sleeper, deaf):
        proc.start()
    assert ready.wait(30), "the SIGTERM-deaf process did not start"
    stop_processes([quick, sleeper, deaf], grace=2.0)
    assert [p.is_alive() for p in (quick, sleeper, deaf)] == [False, False, False]
    assert quick.exitcode == 0
    # SIGTERM's default ends it with -SIGTERM; under coverage (make coverage), whose SIGTERM
    # handler saves its data first, with 1.
    assert sleeper.exitcode in (-signal.SIGTERM, 1)
    assert deaf.exitcode == -signal.SIGKILL
