"""The figures of one running (or ended) epoch, as :class:`~asyncloader._tuning.stats.
LoaderStats`: what ``loader.stats`` answers, read from the epoch's meter, window, fetcher and
progress record (from any thread: it only reads counters and dict entries)."""

from __future__ import annotations

from typing import Any

from asyncloader._base import SkipLedger, Window, counts_between
from asyncloader._checkpoint import Progress
from asyncloader._config import Options
from asyncloader._tuning import EpochMeter, LoaderStats, now
from asyncloader._worker import BatchFetcher, Fetcher


def epoch_stats(
    options: Options,
    meter: EpochMeter,
    progress: Progress,
    window: Window,
    fetcher: Fetcher | BatchFetcher | None,
    skips: SkipLedger | None,
    prefetch: int,
    first_state: tuple[int, Any] | None,
) -> LoaderStats:
    """The epoch's counters and per-stage figures now.

    Args:
        options: The epoch's options.
        meter: The epoch's meter.
        progress: What the consumer received.
        window: The epoch's window (its high-water mark).
        fetcher: The fetch on the loop, if the epoch has one.
        skips: The ``on_error="skip"`` ledger, if any.
        prefetch: The epoch's ``prefetch`` now.
        first_state: ``(first_seq, state)`` of an iterable source at the epoch's start.
    """
    fetching = fetcher.max_fetching if fetcher else 0
    at, elapsed = meter.ended or now(), meter.elapsed()
    fetched = meter.fetch.count > 0
    fetching_mean, engine_mean = meter.in_flight(at)
    # Little's law over a window counts fetches begun before it in full: never above peaks
    fetching_mean = min(fetching_mean, fetching)
    engine_mean = min(engine_mean, options.engine_window_for(prefetch))

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e3

    consumer, received = meter.stall + meter.busy, progress.batches
    device = meter.device.count > 0
    return LoaderStats(
        options.window,
        window.max_ahead,
        options.fetch_concurrency,
        fetching,
        progress.batches,
        skips.count if skips is not None else 0,
        elapsed=elapsed,
        samples=meter.samples,
        throughput=meter.samples / elapsed if elapsed > 0 else 0.0,
        first_batch=meter.first_batch,
        fetch_p50_ms=ms(meter.fetch.quantile(0.5)),
        fetch_p99_ms=ms(meter.fetch.quantile(0.99)),
        fetch_in_flight=fetching_mean if fetched else None,
        engine_ms=ms(meter.engine.mean()),
        engine_in_flight=engine_mean,
        engine_window=options.engine_window_for(prefetch),
        fetch_limit=fetcher.limit if fetcher else options.fetch_concurrency,
        waiting=meter.waiting.mean(at),
        max_waiting=meter.waiting.peak,
        device_ms=ms(meter.device.mean()) if device else None,
        device_busy=meter.device.total / elapsed if device and elapsed > 0 else None,
        stall=meter.stall,
        stall_fraction=meter.stall / consumer if consumer > 0 else 0.0,
        consumer_ms=ms(meter.busy / (received - 1)) if received > 1 else None,
        wait_p50_ms=ms(meter.waits.quantile(0.5)),
        wait_p95_ms=ms(meter.waits.quantile(0.95)),
        wait_p99_ms=ms(meter.waits.quantile(0.99)),
        wait_by_worker=waits_by_worker(meter),
        backpressure=meter.backpressure,
        retries=meter.retries,
        num_workers=options.num_workers,
        prefetch=prefetch,
        batch_bytes=meter.batch_bytes,
        sources=source_counts(options, progress, first_state),
    )


def waits_by_worker(meter: EpochMeter) -> dict[int, dict[str, float]]:
    """Per worker that made a batch waited for: how many, and the waits' p50, p95, p99."""
    out = {}
    for worker, waits in sorted(meter.worker_waits.copy().items()):
        figures = {"batches": float(waits.count)}
        for name, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
            figures[name] = (waits.quantile(q) or 0.0) * 1e3
        out[worker] = figures
    return out


def source_counts(
    options: Options, progress: Progress, first_state: tuple[int, Any] | None
) -> dict[str, int]:
    """Per part of an iterable source that can say (``counts_at``), the samples of the
    batches received in order: its counts at the state before the first batch not
    received, less those at the epoch's first (see ``Progress.checkpoint``)."""
    if first_state is None or options.worker_streams:  # no state, or the merge state
        return {}
    at = progress.checkpoint()["source_state"]
    return counts_between(options.dataset, first_state[1], at)
