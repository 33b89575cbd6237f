"""num_workers="auto" and prefetch="auto": where they start, how they move (between epochs for
the workers, within the epoch for prefetch), the memory budget, and the loader's contracts
(order, exactly once, bounded window) while they move."""

from __future__ import annotations

import pytest

from asyncloader import AsyncLoader
from asyncloader._config import defaults
from asyncloader._tuning import autosize as _autosize
from asyncloader._tuning.autosize import PREFETCH_CAP, PREFETCH_START, PrefetchTuner, WorkerTuner
from asyncloader._tuning.stats import LoaderStats
from tests.helpers import SyncSource, Waiting, add_one, indices_of, jitter
from tests.helpers.contracts import check_bounded_window, check_exactly_once, check_order, epoch

pytestmark = pytest.mark.timeout(60)
GIB = 1 << 30


@pytest.fixture
def cores(monkeypatch):
    """The usable cores "auto" sees: 4 unless a test sets ``cores.n``."""

    class Cores:
        n = 4

    monkeypatch.setattr(_autosize, "available_cores", lambda: Cores.n)
    monkeypatch.setattr(defaults, "available_cores", lambda: Cores.n)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return Cores


def ended(rate=1000.0, engine_in_flight=4.0, batches=100):
    """A finished epoch's stats: ``rate`` samples/s over 10 s after its first batch."""
    return LoaderStats(
        8,
        8,
        64,
        0,
        batches,
        elapsed=11.0,
        first_batch=1.0,
        samples=int(rate * 10),
        engine_in_flight=engine_in_flight,
    )


# -- where "auto" starts ---------------------------------------------------------------------


def test_auto_workers_start_at_the_usable_cores(cores, monkeypatch):
    """A sync __getitem__ gets a worker per usable core, shared among torchrun's local ranks."""
    assert AsyncLoader(SyncSource(8), num_workers="auto").num_workers == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert AsyncLoader(SyncSource(8), num_workers="auto").num_workers == 2


def test_auto_workers_start_at_none_where_they_would_only_collate(cores):
    """An async source without transform or collate_fn is fetched and collated on the loop
    (workers would add a pickle round trip per batch); with a transform, workers run it."""
    assert AsyncLoader(Waiting(8, 0), num_workers="auto").num_workers == 0
    assert AsyncLoader(Waiting(8, 0), num_workers="auto", transform=add_one).num_workers == 4
    fetching = AsyncLoader(Waiting(8, 0), num_workers="auto", fetch_in_workers=True)
    assert fetching.num_workers == 4


@pytest.mark.parametrize("options", [{"prefetch": "auto"}, {}, {"prefetch_factor": None}])
def test_auto_prefetch_is_the_default_starts_at_2_and_bounds_the_window_at_its_cap(options):
    """prefetch="auto" (the default) starts at 2; the window's bound is the one at
    PREFETCH_CAP. An int fixes it."""
    loader = AsyncLoader(SyncSource(8), num_workers=2, **options)
    assert loader.prefetch_factor == PREFETCH_START
    assert loader.stats.window == 2 * PREFETCH_CAP
    assert AsyncLoader(SyncSource(8), num_workers=2, prefetch=2).stats.window == 2 * 2


# -- num_workers between epochs (simulated epochs) -----------------------------------------


def test_workers_grow_while_the_cpu_bound_epochs_speed_up_and_stop_when_not(cores):
    tuner = WorkerTuner(2, GIB)
    assert tuner.epoch_ended(ended(1000), "cpu", 2, 1024) == 3  # a step up
    assert tuner.epoch_ended(ended(1400), "cpu", 2, 1024) == 3  # it paid: kept
    assert tuner.epoch_ended(ended(1400), "cpu", 2, 1024) == 4
    assert tuner.epoch_ended(ended(1450), "cpu", 2, 1024) == 3  # +4% does not pay: undone
    assert tuner.epoch_ended(ended(1400), "cpu", 2, 1024) == 3  # and not tried again


def test_workers_never_exceed_the_cores(cores):
    tuner = WorkerTuner(4, GIB)
    assert tuner.epoch_ended(ended(1000), "cpu", 2, 1024) == 4


def test_idle_workers_shrink_until_the_loader_falls_behind_and_never_below_that(cores):
    tuner = WorkerTuner(4, GIB)
    assert tuner.epoch_ended(ended(500, engine_in_flight=1.0), "consumer", 2, 1024) == 3
    assert tuner.epoch_ended(ended(500, engine_in_flight=1.0), "consumer", 2, 1024) == 3
    assert tuner.epoch_ended(ended(500, engine_in_flight=1.0), "consumer", 2, 1024) == 2
    assert tuner.epoch_ended(ended(400, engine_in_flight=4.0), "cpu", 2, 1024) == 3  # undone
    assert tuner.epoch_ended(ended(500, engine_in_flight=1.0), "consumer", 2, 1024) == 3


def test_busy_workers_under_a_slow_consumer_stay(cores):
    tuner = WorkerTuner(4, GIB)
    assert tuner.epoch_ended(ended(500, engine_in_flight=3.5), "consumer", 2, 1024) == 4


def test_a_short_or_storage_bound_epoch_moves_nothing(cores):
    tuner = WorkerTuner(2, GIB)
    assert tuner.epoch_ended(ended(1000, batches=5), "cpu", 2, 1024) == 2
    assert tuner.epoch_ended(ended(1000), "storage", 2, 1024) == 2


def test_the_memory_budget_caps_the_workers(cores):
    """workers x prefetch batches of the measured size stay within the budget."""
    tuner = WorkerTuner(4, 4 << 20)  # 4 MiB for batches of 1 MiB at prefetch 2: 2 workers
    assert tuner.epoch_ended(ended(1000), "cpu", 2, 1 << 20) == 2
    assert tuner.epoch_ended(ended(1000), "cpu", 2, 1 << 20) == 2


# -- prefetch within an epoch (simulated clock) --------------------------------------------


def drive(tuner, batches, rate_of, stalled=True, full=True, workers=2):
    """Feeds ``tuner`` batches received at ``rate_of(prefetch)`` batches/s, the consumer
    waiting the whole time (``stalled``) or never, every admission blocked (``full``) or
    none; returns the prefetch values it went through."""
    clock = stall = busy = 0.0
    seen = [tuner.prefetch]
    for admitted in range(1, batches + 1):
        step = 1 / rate_of(tuner.prefetch)
        clock += step
        stall, busy = (stall + step, busy) if stalled else (stall, busy + step)
        blocked = admitted if full else 0
        new = tuner.received(clock, stall, busy, admitted, blocked, tuner.prefetch * workers)
        if new is not None:
            seen.append(new)
    return seen


def window_bound(rate_per_slot, ceiling):
    """Batches/s with ``prefetch`` batches per worker: the window's Little's law, up to the
    workers' ceiling."""
    return lambda prefetch: min(prefetch * rate_per_slot, ceiling)


def test_prefetch_doubles_while_it_pays_and_steps_back_when_it_stops():
    tuner = PrefetchTuner(GIB)
    tuner.restart(2)
    seen = drive(tuner, 400, window_bound(100, 500))
    # 2 -> 4 -> 8 pays (200/s -> 400/s -> 500/s); 16 does not: back to 8
    assert seen[:5] == [2, 4, 8, 16, 8]
    assert tuner.prefetch == 8


@pytest.mark.parametrize(("stalled", "full"), [(False, True), (True, False)])
def test_prefetch_stays_unless_the_consumer_waits_on_a_full_window(stalled, full):
    tuner = PrefetchTuner(GIB)
    tuner.restart(2)
    assert drive(tuner, 400, window_bound(100, 500), stalled, full) == [PREFETCH_START]


def test_the_memory_budget_caps_prefetch_growth_but_never_below_the_start():
    tuner = PrefetchTuner(8 << 20)  # 8 MiB for 2 workers' batches of 1 MiB: prefetch 4
    tuner.restart(2)
    assert tuner.measured(1 << 20) is None
    assert max(drive(tuner, 400, window_bound(100, 10_000))) == 4
    small = PrefetchTuner(1 << 20)  # not even the start fits: it stays at the start
    small.restart(2)
    assert small.measured(1 << 20) is None
    assert drive(small, 400, window_bound(100, 10_000)) == [PREFETCH_START]


# -- the loader with "auto" ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_auto_keeps_order_exactly_once_and_the_bounded_window(cores, mode):
    cores.n = 2
    loader = AsyncLoader(
        SyncSource(300), batch_size=4, num_workers="auto", prefetch="auto", transform=jitter
    )
    with loader:
        for _ in range(2):
            batches = epoch(loader, indices_of_batch, mode=mode, slow=True)
            check_order(batches, range(300))
            check_bounded_window(loader.stats)
            assert loader.stats.num_workers == 2 and loader.stats.prefetch >= PREFETCH_START


def indices_of_batch(batch):
    return [int(x) for x in batch[:, 0]]


def test_auto_out_of_order_delivers_each_sample_once(cores):
    cores.n = 2
    loader = AsyncLoader(
        SyncSource(200), batch_size=4, num_workers="auto", prefetch="auto", in_order=False
    )
    with loader:
        check_exactly_once(epoch(loader, indices_of_batch, slow=True), range(200))
        check_bounded_window(loader.stats)


def test_the_window_and_the_engine_follow_prefetch_within_the_epoch(monkeypatch):
    """Every step paying (GAIN 0), a loader-bound epoch climbs to PREFETCH_CAP; batches ahead
    then go past the start's window and stay within the bound."""
    monkeypatch.setattr(_autosize, "GAIN", 0.0)
    loader = AsyncLoader(
        SyncSource(400), batch_size=1, num_workers=1, prefetch="auto", transform=jitter
    )
    with loader:
        check_order(epoch(loader, indices_of_batch), range(400))
    stats = loader.stats
    assert stats.prefetch == PREFETCH_CAP
    assert PREFETCH_START < stats.max_ahead <= stats.window == PREFETCH_CAP
    assert stats.engine_in_flight > PREFETCH_START  # the engine's room grew with it


def test_persistent_workers_are_rebuilt_when_the_count_changes(cores, monkeypatch):
    cores.n = 2
    loader = AsyncLoader(SyncSource(40), batch_size=4, num_workers="auto", persistent_workers=True)
    with loader:
        it = iter(loader)
        first = {p.pid for p in it._workers}
        assert indices_of(it) == list(range(40)) and len(first) == 2
        again = iter(loader)
        assert {p.pid for p in again._workers} == first  # same count: the same pool
        assert indices_of(again) == list(range(40))

        def one_fewer(tuner, *measured):
            tuner.count = 1
            return 1

        monkeypatch.setattr(WorkerTuner, "epoch_ended", one_fewer)
        third = iter(loader)
        now = {p.pid for p in third._workers}
        assert len(now) == 1 and not now & first and loader.num_workers == 1
        assert indices_of(third) == list(range(40))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"num_workers": "many"}, TypeError, "num_workers must be an int or 'auto', got 'many'"),
        ({"prefetch": "lots"}, TypeError, "prefetch must be an int or 'auto', got 'lots'"),
        ({"prefetch_factor": "x", "num_workers": 1}, TypeError, "prefetch_factor"),
        ({"io_concurrency": "fast"}, TypeError, "io_concurrency must be an int or 'auto'"),
        ({"num_workers": "auto", "executor": object()}, TypeError, "executor"),
        (
            {"memory_budget": 1 << 20, "prefetch": 2, "io_concurrency": 64},
            ValueError,
            'bounds the "auto" settings',
        ),
    ],
)
def test_bad_options_name_themselves(options, error, match):
    with pytest.raises(error, match=match):
        AsyncLoader(SyncSource(4), **options)


def test_auto_accepts_what_workers_need(cores):
    """persistent_workers, a start method and prefetch_factor are accepted with
    num_workers="auto", even where it starts without workers; an executor is not."""
    from concurrent.futures import ThreadPoolExecutor

    AsyncLoader(Waiting(4, 0), num_workers="auto", persistent_workers=True, mp_context="spawn")
    AsyncLoader(SyncSource(4), num_workers="auto", prefetch_factor="auto")
    AsyncLoader(SyncSource(4), prefetch="auto", memory_budget=1 << 20)
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="num_workers='auto'"):
        AsyncLoader(SyncSource(4), num_workers="auto", executor=pool)
