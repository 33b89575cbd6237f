"""``loader.report()``: which stage holds the epoch back, the evidence, and the knob to turn.

Rules, first match wins (a pipeline runs at the pace of its slowest stage; the consumer
waiting is what says the loader is the slow one):

1. The consumer waited for under 10% of its time: the consumer (the training step) is the
   bottleneck, not the loader.
2. The device stage was busy 70% of the epoch or more: the copy (pin, copy,
   ``device_transform``).
3. The engine held 75% of its window or more on average: the workers' CPU (transform and
   collate; with ``fetch_in_workers``, the fetch too).
4. The samples in flight averaged 75% of the fetch limit or more (``io_concurrency``, or
   where ``"auto"`` holds it): storage.
5. Otherwise neither stage is full: the source's own iteration, the sampler, or the event
   loop's thread.

Without workers, fetch threads and the transform thread share this process's GIL: a
CPU-heavy transform then slows a sync ``__getitem__`` too, and the fetch can look full.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from asyncloader._config import CAP as AUTO_CAP
from asyncloader._config import Options
from asyncloader._tuning.stats import LoaderStats

CONSUMER_STALL, DEVICE_BUSY, ENGINE_FULL, FETCH_FULL = 0.10, 0.70, 0.75, 0.75


@dataclass(frozen=True)
class Diagnosis:
    """``stage``: ``"consumer"``, ``"device"``, ``"cpu"``, ``"storage"``, ``"source"`` or
    ``"unknown"`` (too early to tell); ``evidence`` and ``knob`` are sentences."""

    stage: str
    evidence: str
    knob: str


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} ms"


def diagnose(stats: LoaderStats, options: Options) -> Diagnosis:
    """The bottleneck of the epoch ``stats`` describes (see the module rules)."""
    if stats.batches < 3:
        return Diagnosis("unknown", f"only {stats.batches} batches so far", "run longer")
    if stats.stall_fraction < CONSUMER_STALL:
        return Diagnosis(
            "consumer",
            f"the consumer waited for data {stats.stall_fraction:.0%} of its time; its own "
            f"step takes {_ms(stats.consumer_ms)} per batch",
            "nothing to raise in the loader (a lower prefetch would save memory)",
        )
    if stats.device_busy is not None and stats.device_busy >= DEVICE_BUSY:
        return Diagnosis(
            "device",
            f"the device stage was busy {stats.device_busy:.0%} of the epoch, "
            f"{_ms(stats.device_ms)} per batch",
            "move fewer bytes (uint8 images, normalised on the device), pin_memory=True, or "
            "a lighter device_transform",
        )
    if stats.engine_window and stats.engine_in_flight >= ENGINE_FULL * stats.engine_window:
        workers = options.num_workers
        where = "the workers" if workers else "the loader's transform thread"
        also = " (fetch included: if the workers wait on storage, raise io_concurrency)"
        return Diagnosis(
            "cpu",
            f"{where} held {stats.engine_in_flight:.1f} of {stats.engine_window} batches on "
            f"average, {_ms(stats.engine_ms)} per batch",
            (f"raise num_workers (now {workers}, cores: {os.cpu_count()})" if workers else
             "set num_workers to run transform and collate in worker processes")
            + (also if options.fetch_in_workers else ""),
        )  # fmt: skip
    # Under io_concurrency="auto" the limit is where the tuner holds it, not the cap.
    limit = stats.fetch_limit if options.auto_io else stats.io_concurrency
    if stats.fetch_in_flight is not None and stats.fetch_in_flight >= FETCH_FULL * limit:
        knob = (
            f'io_concurrency="auto" holds {limit}: growing stopped paying (the event loop\'s '
            f"CPU: fetch_in_workers=True) or met its cap ({AUTO_CAP}, memory_budget, half the "
            "open files left: ulimit -n)"
            if options.auto_io
            else f"raise io_concurrency (now {limit}; try {2 * limit})"
        )
        return Diagnosis(
            "storage",
            f"waiting on storage: fetch p50 {_ms(stats.fetch_p50_ms)}, p99 "
            f"{_ms(stats.fetch_p99_ms)}, {stats.fetch_in_flight:.0f} of {limit} in flight on "
            "average (at the limit)",
            knob,
        )
    return Diagnosis(
        "source",
        "neither the fetch nor the engine is full: the source's own iteration, the sampler "
        "or the event loop's thread sets the pace",
        "fetch_in_workers=True, to iterate the source and fetch in every worker",
    )


def render(stats: LoaderStats, diagnosis: Diagnosis, epoch: int) -> str:
    """The report's text: a summary line, the bottleneck, then one line per stage."""
    first = "-" if stats.first_batch is None else f"{stats.first_batch:.2f} s"
    lines = [
        f"asyncloader, epoch {epoch}: {stats.batches} batches, {stats.samples} samples in "
        f"{stats.elapsed:.1f} s ({stats.throughput:,.0f} samples/s); first batch after {first}",
        f"bottleneck: {diagnosis.stage}: {diagnosis.evidence}; {diagnosis.knob}",
        f"  consumer  waited {stats.stall_fraction:.0%} of its time ({stats.stall:.2f} s; "
        f"per batch p50 {_ms(stats.wait_p50_ms)}, p95 {_ms(stats.wait_p95_ms)}, "
        f"p99 {_ms(stats.wait_p99_ms)}), its step {_ms(stats.consumer_ms)} per batch; "
        f"the loader waited for it {stats.backpressure:.2f} s",
    ]
    if len(stats.wait_by_worker) > 1:
        lines.append("  by worker " + "; ".join(
            f"{w}: p50 {_ms(f['p50_ms'])}, p95 {_ms(f['p95_ms'])}"
            for w, f in stats.wait_by_worker.items()
        ))  # fmt: skip
    if stats.fetch_in_flight is not None:
        lines.append(
            f"  fetch     p50 {_ms(stats.fetch_p50_ms)}, p99 {_ms(stats.fetch_p99_ms)}; "
            f"{stats.fetch_in_flight:.1f} of {stats.fetch_limit} in flight on average "
            f"(peak {stats.max_fetching})"
        )
    if stats.engine_ms is not None:
        lines.append(
            f"  engine    {_ms(stats.engine_ms)} per batch; {stats.engine_in_flight:.1f} of "
            f"{stats.engine_window} batches in it on average"
        )
    lines.append(
        f"  ready     {stats.waiting:.1f} batches waiting for the consumer on average "
        f"(peak {stats.max_waiting})"
    )
    if stats.device_ms is not None:
        lines.append(f"  device    {_ms(stats.device_ms)} per batch, busy {stats.device_busy:.0%}")
    if stats.sources:
        total = sum(stats.sources.values()) or 1
        parts = (f"{name} {n} ({n / total:.0%})" for name, n in stats.sources.items())
        lines.append(f"  sources   {', '.join(parts)} of the samples received")
    if stats.retries or stats.skipped:
        lines.append(f"  retries {stats.retries}, skipped samples {stats.skipped}")
    return "\n".join(lines)
