"""What a loader reports about its current (or last) epoch: counters and per-stage figures."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LoaderStats:
    """Counters and per-stage figures of a loader's current (or last) epoch.

    Times are seconds unless named ``_ms``; a figure of a stage the epoch does not have (no
    fetch on the loop, no device stage) is ``None``. Everything is measured in the training
    process (see :mod:`asyncloader._tuning.meter`); with ``fetch_in_workers`` the samples' fetch is
    part of the engine's round trip.

    Attributes:
        window: Bound on batches taken from the sampler and not yet handed to the consumer.
        max_ahead: High-water mark of those batches; never exceeds ``window``.
        io_concurrency: Bound on samples being fetched at once on the event loop (with
            ``io_concurrency="auto"``, the highest the limit may go).
        max_fetching: High-water mark of those samples; never exceeds ``io_concurrency``.
        batches: Batches handed to the consumer (with ``on_error="skip"``, a batch whose
            samples were all skipped counts, though it is not yielded).
        skipped: Samples left out under ``on_error="skip"`` (counted as batches are received).
        elapsed: Seconds since the epoch started (to its end, once it ended).
        samples: Samples handed to the consumer.
        throughput: ``samples / elapsed``.
        first_batch: Seconds from the epoch's start to its first batch.
        fetch_p50_ms, fetch_p99_ms: Latency of one sample's fetch on the loop (the last
            8,192 samples fetched, every 4th kept).
        fetch_in_flight: Mean samples being fetched at once (against ``fetch_limit``).
        fetch_limit: The loop's fetch limit now: ``io_concurrency``, or where
            ``io_concurrency="auto"`` has moved it.
        engine_ms: Mean round trip of a batch through the engine (workers, executor or the
            transform thread): transform and collate, and with ``fetch_in_workers`` the fetch.
        engine_in_flight: Mean batches in the engine, against ``engine_window``.
        engine_window: Bound on batches in the engine.
        waiting: Mean batches done and not yet taken by the consumer (reorder buffer and
            device stage); ``max_waiting`` their high-water mark.
        device_ms: Mean time of one batch in the device stage (pin, copy, device_transform).
        device_busy: Share of the epoch the device stage was busy.
        stall: Seconds the consumer waited for a batch, after the first; ``stall_fraction``
            their share of the consumer's time (waiting and its own steps).
        wait_p50_ms, wait_p95_ms, wait_p99_ms: The consumer's wait for one batch inside
            ``next()`` (after the first batch; the last 2,048 waits).
        wait_by_worker: ``{worker: {"batches": n, "p50_ms": .., "p95_ms": .., "p99_ms": ..}}``:
            those waits split by the worker that made the batch waited for (worker
            processes or Ray actors; empty without them). A worker whose p95 stands out is
            held up by its own part of the data or its machine.
        consumer_ms: Mean time the consumer spent between two batches (its own step).
        backpressure: Seconds the loader waited for a slot while a batch was ready and the
            consumer had not taken it.
        retries: Retried requests of this process's sources during the epoch.
        num_workers: The epoch's worker processes (``num_workers="auto"`` moves it between
            epochs).
        prefetch: Batches per worker in the engine's window now (``prefetch="auto"`` moves
            it within the epoch).
        batch_bytes: Bytes of the tensors and arrays of the epoch's first batch (0 before it).
        sources: ``{name: samples}``: the samples handed to the consumer (the batches
            received in order, since the epoch's start or the resume) per source, for a
            dataset that can say (``counts_at``, as ``asyncloader.sources.Mix``); else empty.
    """

    window: int
    max_ahead: int
    io_concurrency: int
    max_fetching: int
    batches: int
    skipped: int = 0
    elapsed: float = 0.0
    samples: int = 0
    throughput: float = 0.0
    first_batch: float | None = None
    fetch_p50_ms: float | None = None
    fetch_p99_ms: float | None = None
    fetch_in_flight: float | None = None
    fetch_limit: int = 0
    engine_ms: float | None = None
    engine_in_flight: float = 0.0
    engine_window: int = 0
    waiting: float = 0.0
    max_waiting: int = 0
    device_ms: float | None = None
    device_busy: float | None = None
    stall: float = 0.0
    stall_fraction: float = 0.0
    consumer_ms: float | None = None
    wait_p50_ms: float | None = None
    wait_p95_ms: float | None = None
    wait_p99_ms: float | None = None
    wait_by_worker: dict[int, dict[str, float]] = field(default_factory=dict)
    backpressure: float = 0.0
    retries: int = 0
    num_workers: int = 0
    prefetch: int = 0
    batch_bytes: int = 0
    sources: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The figures as a flat dict of numbers (``None`` left out, ``sources`` as
        ``"sources/<name>"``, ``wait_by_worker`` as ``"wait_by_worker/<w>/<figure>"``), for
        a metrics logger."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        for name, n in out.pop("sources").items():
            out[f"sources/{name}"] = n
        for worker, figures in out.pop("wait_by_worker").items():
            for figure, value in figures.items():
                out[f"wait_by_worker/{worker}/{figure}"] = value
        return out
