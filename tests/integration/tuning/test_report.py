"""loader.stats per-stage figures and loader.report(): the bottleneck named on constructed
cases, one per stage. The workloads wait or burn on purpose: that is what they measure."""

import time

import numpy as np
import pytest
import torch

from asyncloader import AsyncLoader
from tests.helpers import Waiting

pytestmark = pytest.mark.timeout(60)


def burn(x):
    """About 3 ms of pure Python per sample."""
    end = time.thread_time() + 0.003
    while time.thread_time() < end:
        pass
    return x


class SlowIterable:
    def __iter__(self):
        for i in range(120):
            time.sleep(0.002)
            yield i


def heavy_device_step(batch):
    for _ in range(20):
        batch = batch.clone()
    return batch


def run(loader, step_s=0.0):
    for _ in loader:
        if step_s:
            time.sleep(step_s)  # the training step
    return loader


CASES = {
    "storage": lambda: run(AsyncLoader(Waiting(160, 0.02), batch_size=8, io_concurrency=8)),
    # prefetch fixed: "auto" may grow the window past what one busy worker keeps in flight on
    # a loaded machine, and the report then names the source (a known limit of its rules).
    "cpu": lambda: run(
        AsyncLoader(list(range(160)), batch_size=8, transform=burn, num_workers=1, prefetch=2)
    ),
    "consumer": lambda: run(AsyncLoader(list(range(160)), batch_size=8), step_s=0.005),
    "device": lambda: run(
        AsyncLoader(
            [torch.ones(256, 1024) for _ in range(48)],
            batch_size=8,
            device="cpu",
            device_transform=heavy_device_step,
        )
    ),
    "source": lambda: run(AsyncLoader(SlowIterable(), batch_size=8)),
}


@pytest.mark.parametrize("stage", sorted(CASES))
def test_the_report_names_the_stage_that_holds_the_epoch_back(stage):
    loader = CASES[stage]()
    assert loader.bottleneck().stage == stage, loader.report()
    assert f"bottleneck: {stage}:" in loader.report()


class WaitingKiB(Waiting):
    async def __getitem__(self, index: int) -> np.ndarray:
        await super().__getitem__(index)
        return np.full(1024, index % 256, np.uint8)


def test_under_auto_storage_is_judged_against_the_limit_it_holds():
    """io_concurrency="auto" (the default) capped at 16 by the memory budget: 16 in flight is
    the limit, not 4096, and the knob says what holds it."""
    loader = run(AsyncLoader(WaitingKiB(160, 0.02), batch_size=8, memory_budget=16 << 10))
    assert loader.stats.fetch_limit == 16 and loader.stats.io_concurrency == 4096
    diagnosis = loader.bottleneck()
    assert diagnosis.stage == "storage", loader.report()
    assert "of 16 in flight" in diagnosis.evidence and 'io_concurrency="auto" holds 16' in (
        diagnosis.knob
    )


def test_stats_measure_each_stage():
    loader = CASES["storage"]()
    stats = loader.stats
    assert stats.batches == 20 and stats.samples == 160
    assert 18 <= stats.fetch_p50_ms <= stats.fetch_p99_ms
    assert 6 <= stats.fetch_in_flight <= 8 == stats.io_concurrency
    assert stats.throughput == pytest.approx(160 / stats.elapsed)
    assert stats.stall_fraction > 0.5 and stats.first_batch > 0
    assert 0 < stats.wait_p50_ms <= stats.wait_p95_ms <= stats.wait_p99_ms
    assert "per batch p50" in loader.report()
    assert stats.device_ms is None  # no device stage
    logged = stats.as_dict()
    assert logged["samples"] == 160 and "device_ms" not in logged


def test_a_new_epoch_keeps_the_last_ones_stats():
    loader = AsyncLoader(list(range(32)), batch_size=8)
    assert loader.previous_stats is None and loader.bottleneck().stage == "unknown"
    list(loader)
    first = loader.stats
    list(loader)
    assert loader.previous_stats == first and loader.stats.samples == 32


def test_the_consumers_waits_have_percentiles(monkeypatch):
    """Each wait after the first batch is kept: p50, p95 and p99 by nearest rank."""
    from asyncloader._tuning import meter as meter_module

    times = iter([0.0, 1.0] + [t for k in range(1, 101) for t in (10.0 * k, 10.0 * k + k / 1e3)])
    monkeypatch.setattr(meter_module, "now", lambda: next(times))
    meter = meter_module.EpochMeter()
    meter.received(0.0)  # the first batch: start-up, not a wait
    for _ in range(100):
        meter.received(next(times))
    assert meter.waits.count == 100
    assert [round(meter.waits.quantile(q) * 1e3) for q in (0.5, 0.95, 0.99)] == [51, 96, 100]


def test_each_wait_counts_for_the_worker_that_made_the_batch(monkeypatch):
    """A wait is the worker's whose batch the consumer waited for; batches of no named worker
    (made on the loop) count only in the whole."""
    from asyncloader._tuning import meter as meter_module

    times = iter([0.0, 1.0] + [t for k in range(1, 7) for t in (10.0 * k, 10.0 * k + k / 1e3)])
    monkeypatch.setattr(meter_module, "now", lambda: next(times))
    meter = meter_module.EpochMeter()
    for seq, worker in enumerate([0, 1, 0, 1, 0, None]):
        meter.made_by(seq, worker)
    meter.received(0.0, 0)  # the first batch: start-up, not a wait
    for seq in range(1, 7):
        meter.received(next(times), seq)
    assert meter.waits.count == 6
    waits = {w: [round(t * 1e3) for t in d._ring[: d.count]] for w, d in meter.worker_waits.items()}
    assert waits == {0: [2, 4], 1: [1, 3]}


class SlowInOneWorker(torch.utils.data.Dataset):
    """Worker 1 takes 20 ms a sample, the others none."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> int:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            time.sleep(0.02)
        return i


class SlowStreamInOneWorker(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 96, info.num_workers):
            if info.id == 1:
                time.sleep(0.02)
            yield i


@pytest.mark.parametrize("dataset", [SlowInOneWorker, SlowStreamInOneWorker])
def test_the_waits_say_which_worker_holds_the_epoch_back(dataset):
    loader = run(AsyncLoader(dataset(), batch_size=4, num_workers=2, fetch_in_workers=True))
    by_worker = loader.stats.wait_by_worker
    assert sorted(by_worker) == [0, 1], by_worker
    assert sum(f["batches"] for f in by_worker.values()) == loader.stats.batches - 1
    assert by_worker[1]["p50_ms"] > 40 > by_worker[0]["p50_ms"], by_worker
    assert "by worker 0: p50" in loader.report()
    assert loader.stats.as_dict()["wait_by_worker/1/p95_ms"] == by_worker[1]["p95_ms"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_wait_is_a_range_in_torch_profilers_trace(mode):
    """While torch.profiler records, each wait for a batch is a record_function range named
    "asyncloader: wait for batch N"; with no profiler, none is made."""
    import asyncio

    loader = AsyncLoader(list(range(32)), batch_size=8)
    with torch.profiler.profile() as prof:
        if mode == "sync":
            list(loader)
        else:

            async def drain():
                return [b async for b in loader]

            asyncio.run(drain())
    names = {e.name for e in prof.events() if e.name.startswith("asyncloader")}
    assert names == {f"asyncloader: wait for batch {n}" for n in range(5)}
