"""io_concurrency="auto": the fetch limit climbs while growing pays, steps back when it does
not, follows a change in latency, respects the memory budget; the window follows it."""

import asyncio
import os
import resource

import numpy as np
import pytest

from asyncloader import AsyncLoader
from asyncloader._base.window import Window
from asyncloader._config.defaults import CAP
from asyncloader._tuning import io_limit as _autotune
from asyncloader._tuning.io_limit import HOLD_S, START, FetchTuner
from tests.helpers import Waiting
from tests.helpers.contracts import check_bounded_window, check_exactly_once

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def files_unlimited(monkeypatch):
    """The simulated climbs below are about the algorithm: no open-files cap under them."""
    monkeypatch.setattr(_autotune, "file_room", lambda: None)


def drive(tuner, seconds, rate_of, clock=0.0, sample=b"x" * 100):
    """Feeds ``tuner`` saturated completions for ``seconds`` of a simulated clock, at the
    samples/s ``rate_of(limit)`` gives; returns the clock and the limits it went through."""
    limits = [tuner.limit]
    end = clock + seconds
    while clock < end:
        clock += 1 / rate_of(tuner.limit)
        new = tuner.completed(True, clock, sample)
        if new is not None:
            limits.append(new)
    return clock, limits


def latency_bound(latency, ceiling=30000.0):
    """Samples/s of a fetch at ``limit`` in flight: Little's law, up to the loop's ceiling."""
    return lambda limit: min(limit / latency, ceiling)


def test_it_climbs_while_growing_pays_and_steps_back_when_it_stops(files_unlimited):
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    assert tuner.limit == START
    _, limits = drive(tuner, 2.0, latency_bound(0.05, ceiling=12000))
    # 64 -> 256 -> 1024 pays (1,280/s -> 5,120/s -> 12,000/s); 4096 does not: back to 1024
    assert limits[:4] == [64, 256, 1024, 4096] and limits[4] == 1024


def test_it_follows_a_rise_in_latency(files_unlimited):
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    clock, _ = drive(tuner, 3.0, latency_bound(0.005, ceiling=20000))
    settled = tuner.limit
    assert settled <= 256  # 5 ms: ~100 in flight reach the ceiling
    _, limits = drive(tuner, HOLD_S + 2.0, latency_bound(0.05, ceiling=20000), clock)
    assert max(limits) >= 4 * settled  # 50 ms: ten times as many are needed


def loop_bound(latency, ceiling, knee):
    """Little's law up to the loop's ``ceiling``, reached at ``knee`` in flight; past it
    each request in flight costs the loop more (timers, tasks), and samples/s falls."""
    return lambda limit: min(limit / latency, ceiling * min(1.0, (knee / limit) ** 0.5))


def test_a_loop_bound_fetch_settles_at_the_knee_despite_the_burst_after_each_step(
    files_unlimited,
):
    """Right after a step the requests it added complete together (here: the first round
    after a change runs at twice the rate): judged on that round, the climb went on to
    4096, at half the knee's rate. It settles at the knee, and probes back down to it."""
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    true_rate = loop_bound(0.004, 60000, 256)
    changed_at, clock, limits = 0, 0.0, [tuner.limit]
    done = 0
    while clock < 6.0:
        burst = done - changed_at < max(tuner.limit, 32)
        clock += 1 / (true_rate(tuner.limit) * (2 if burst else 1))
        done += 1
        new = tuner.completed(True, clock, b"x")
        if new is not None:
            limits.append(new)
            changed_at = done
    assert max(limits) <= 1024 and tuner.limit in (128, 256, 512), limits
    tail = limits[len(limits) // 2 :]
    assert tail.count(256) >= len(tail) // 2, f"it left the knee: {limits}"


def test_a_halving_that_costs_nothing_is_kept(files_unlimited):
    """A limit above what the loop needs (the latency fell: samples/s the same at half)
    comes down, after the next step up did not pay."""
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    clock, _ = drive(tuner, 3.0, latency_bound(0.05, ceiling=12000))
    high = tuner.limit
    assert high >= 1024
    _, limits = drive(tuner, 6.0, latency_bound(0.002, ceiling=12000), clock)
    assert tuner.limit <= high // 4, limits


def test_an_unsaturated_fetch_keeps_its_limit(files_unlimited):
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    for i in range(1, 2000):
        assert tuner.completed(False, i * 0.001, b"x") is None
    assert tuner.limit == START


def test_the_memory_budget_caps_the_limit(files_unlimited):
    tuner = FetchTuner(CAP, 64 << 20, 0.0)  # 64 MiB for samples of 1 MiB: at most 64
    sample = np.zeros(1 << 20, np.uint8)
    _, limits = drive(tuner, 2.0, latency_bound(0.01), sample=sample)
    assert max(limits) <= 64


@pytest.fixture
def few_files():
    """This process may open 200 more files than it has open: half of that is the room."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 200, hard))
    try:
        yield 100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_the_open_files_limit_caps_the_limit(few_files):
    """A request in flight may hold a socket: the climb stops at half the files left, not at
    "Too many open files" (an HTTP source at the usual soft limit of 1,024 failed so)."""
    tuner = FetchTuner(CAP, 1 << 30, 0.0)
    _, limits = drive(tuner, 3.0, latency_bound(0.1))
    assert START <= max(limits) <= few_files and tuner.limit > START


def test_a_shrunk_window_gives_back_slots_only_past_its_debt():
    async def run():
        window = Window(4)
        for _ in range(4):
            await window.admit()
        window.resize(2)
        window.release()
        window.release()  # two batches left: the debt is paid, no slot given back
        assert window._permits._value == 0 and window.ahead == 2
        window.release()
        assert window._permits._value == 1
        window.resize(5)
        assert window._permits._value + window.ahead == 5

    asyncio.run(run())


@pytest.mark.parametrize("placement", ["loop", "workers"])
def test_auto_raises_the_limit_and_keeps_every_contract(placement):
    options = {"num_workers": 2, "fetch_in_workers": True} if placement == "workers" else {}
    loader = AsyncLoader(Waiting(6000, 0.02), batch_size=16, io_concurrency="auto", **options)
    for _ in range(2):
        batches = [b.tolist() for b in loader]
        assert [x for b in batches for x in b] == list(range(6000))  # in order, each once
    stats = loader.stats
    assert stats.io_concurrency == CAP and stats.max_ahead <= stats.window
    if placement == "loop":
        assert stats.fetch_limit > START  # it climbed, and the second epoch kept it
        assert loader.previous_stats.max_fetching > START


def test_auto_out_of_order_delivers_each_sample_once():
    loader = AsyncLoader(Waiting(500, 0.001), batch_size=8, io_concurrency="auto", in_order=False)
    check_exactly_once([b.tolist() for b in loader], range(500))
    check_bounded_window(loader.stats)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"io_concurrency": "fast"}, TypeError, "io_concurrency"),
        ({"io_concurrency": "auto", "memory_budget": 0}, ValueError, "memory_budget"),
        ({"io_concurrency": "auto", "memory_budget": 1.5}, TypeError, "memory_budget"),
        (
            {"memory_budget": 1 << 20, "prefetch": 2, "io_concurrency": 64},
            ValueError,
            "memory_budget",
        ),
    ],
)
def test_bad_options_name_themselves(options, error, match):
    with pytest.raises(error, match=match):
        AsyncLoader(Waiting(4, 0), **options)
