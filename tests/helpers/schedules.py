"""Randomised schedules for simulated epochs: what each sample costs and how it ends.

A :class:`Schedule` is drawn from a seed, so a failing run is replayed from the seed its
assertion prints. Latencies have a regime (2 ms to 100 ms per sample) that may change once
mid-epoch, bursts of samples ten times slower, and a few samples that fail or raise
``CancelledError`` of their own (some clients do on their timeouts).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

REGIMES = (0.002, 0.005, 0.02, 0.1)


class Boom(ValueError):
    """The source's own failure for a sample the schedule marks as failing."""


@dataclass
class Schedule:
    """One epoch's samples: ``latency[i]`` seconds to fetch sample ``i``, which fails
    (``fails``) or raises ``CancelledError`` (``cancels``) instead of returning ``i``."""

    seed: int
    latency: list[float]
    fails: frozenset[int] = frozenset()
    cancels: frozenset[int] = frozenset()
    calls: dict[int, int] = field(default_factory=dict)

    @classmethod
    def draw(cls, seed: int, samples: int, faults: bool = True) -> Schedule:
        rng = random.Random(seed)
        regimes = [rng.choice(REGIMES), rng.choice(REGIMES)]
        change = rng.randrange(samples) if rng.random() < 0.5 else samples
        latency = []
        burst = 0
        for i in range(samples):
            base = regimes[i >= change]
            if burst == 0 and rng.random() < 0.01:
                burst = rng.randint(5, 200)
            factor = 10.0 if burst else 1.0
            burst = max(0, burst - 1)
            latency.append(base * factor * rng.uniform(0.5, 1.5))
        fails: set[int] = set()
        cancels: set[int] = set()
        if faults and rng.random() < 0.5:
            fails = {rng.randrange(samples) for _ in range(rng.randint(1, 4))}
            cancels = {rng.randrange(samples) for _ in range(rng.randint(0, 2))} - fails
        return cls(seed, latency, frozenset(fails), frozenset(cancels))

    def bound(self, slack: float = 1.0) -> float:
        """Virtual seconds an epoch may take at most: every sample one after another, plus
        ``slack``. A live fetch at a limit of at least one never takes longer."""
        return sum(self.latency) + slack

    async def get(self, index: int) -> int:
        """The source: sleeps the sample's latency, then returns it (or raises)."""
        self.calls[index] = self.calls.get(index, 0) + 1
        await asyncio.sleep(self.latency[index])
        if index in self.fails:
            raise Boom(f"sample {index} fails")
        if index in self.cancels:
            raise asyncio.CancelledError(f"sample {index}: the client's own timeout")
        return index


def run_block(simulate: Callable[[int], None], block: int, blocks: int, runs: int) -> None:
    """``simulate(seed)`` for block ``block`` of ``blocks`` of ``runs`` seeds; a failure names
    the call that replays it."""
    for seed in range(block * runs // blocks, (block + 1) * runs // blocks):
        try:
            simulate(seed)
        except BaseException as exc:
            exc.add_note(f"replay: {simulate.__module__}.simulate({seed})")
            raise
