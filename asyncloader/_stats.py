"""Counters a loader reports about its current (or last) epoch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoaderStats:
    """Counters of a loader's current (or last) epoch.

    Attributes:
        window: Bound on batches taken from the sampler and not yet handed to the consumer.
        max_ahead: High-water mark of those batches; never exceeds ``window``.
        io_concurrency: Bound on samples being fetched at once on the event loop.
        max_fetching: High-water mark of those samples; never exceeds ``io_concurrency``.
        batches: Batches handed to the consumer (with ``on_error="skip"``, a batch whose
            samples were all skipped counts, though it is not yielded).
        skipped: Samples left out under ``on_error="skip"`` (counted as batches are received).
    """

    window: int
    max_ahead: int
    io_concurrency: int
    max_fetching: int
    batches: int
    skipped: int = 0
