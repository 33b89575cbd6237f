"""Epochs of 20,000 samples with every option at its default, under a watchdog: run by
tests/system/test_defaults_at_scale.py, each placement in a fresh interpreter.

``python default_epochs.py PLACEMENT LATENCY_MS... [--watchdog-s 30] [--samples 20000]``

PLACEMENT is ``loop`` (num_workers=0), ``fetch_threads`` (a sync ``__getitem__`` on 64 fetch
threads, as docs/tuning.md has it for one that waits on IO), ``workers`` (num_workers=2) or
``fetch_in_workers`` (num_workers=2, fetch_in_workers=True); ``stuck`` is ``loop`` over a
source whose sample 100 never arrives (to see the watchdog fire). Each latency is one epoch of
a new loader at batch size 64; every sample must arrive once and in order. Prints one line
per epoch: ``epoch PLACEMENT LATENCY_MS ms: SECONDS s, SAMPLES samples, io limit LIMIT``.

Watchdog: when no batch arrives for ``--watchdog-s`` seconds, it writes what
``asyncloader.diagnose.dump_state`` says (each stage, the loop's tasks, every thread's stack)
to stderr and exits with status 3 at once; a wrong epoch exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time

import numpy as np
import torch

from asyncloader import AsyncLoader
from asyncloader.diagnose import dump_state

STALLED, WRONG = 3, 2
PLACEMENTS = {
    "loop": {},
    "fetch_threads": {"fetch_threads": 64},
    "workers": {"num_workers": 2},
    "fetch_in_workers": {"num_workers": 2, "fetch_in_workers": True},
    "stuck": {},
}


class Remote:
    """Sample ``i`` is ``np.full(4, i)``, ``latency_s`` after it is asked for."""

    def __init__(self, n: int, latency_s: float, never: int | None = None) -> None:
        self.n, self.latency_s, self.never = n, latency_s, never

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        if index == self.never:
            await asyncio.Event().wait()
        await asyncio.sleep(self.latency_s)
        return np.full(4, index)


class RemoteSync(Remote):
    """:class:`Remote` with a sync ``__getitem__`` that blocks its thread for the latency."""

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        time.sleep(self.latency_s)
        return np.full(4, index)


class Watchdog:
    """Dumps the loader's state and exits the process when :meth:`beat` is not called for
    ``seconds``."""

    def __init__(self, seconds: float, what: str) -> None:
        self._seconds, self._what = seconds, what
        self._beat = threading.Condition()
        self._beats = 0
        self._loader: AsyncLoader | None = None
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def watch(self, loader: AsyncLoader | None, what: str) -> None:
        with self._beat:
            self._loader, self._what = loader, what
            self.beat()

    def beat(self) -> None:
        with self._beat:
            self._beats += 1
            self._beat.notify()

    def _watch(self) -> None:
        with self._beat:
            while True:
                seen = self._beats
                if not self._beat.wait_for(lambda seen=seen: self._beats != seen, self._seconds):
                    break
            loader, what = self._loader, self._what
        text = dump_state(loader) if loader is not None else "(no loader)"
        sys.stderr.write(f"WATCHDOG: no batch for {self._seconds:g} s in {what}\n{text}\n")
        sys.stderr.flush()
        os._exit(STALLED)


def epoch(placement: str, latency_ms: float, samples: int, watchdog: Watchdog) -> str:
    latency_s = latency_ms / 1000
    never = 100 if placement == "stuck" else None
    source_type = RemoteSync if placement == "fetch_threads" else Remote
    loader = AsyncLoader(
        source_type(samples, latency_s, never), batch_size=64, **PLACEMENTS[placement]
    )
    what = f"{placement} at {latency_ms:g} ms"
    watchdog.watch(loader, what)
    batches = []
    began = time.perf_counter()
    with loader:
        for batch in loader:
            watchdog.beat()
            batches.append(batch)
        seconds = time.perf_counter() - began
        limit = loader.stats.fetch_limit
    watchdog.watch(None, f"{what}, between epochs")
    got = torch.cat(batches) if batches else torch.empty(0, 4, dtype=torch.int64)
    expected = torch.arange(samples).unsqueeze(1).expand(samples, 4)
    if got.shape != expected.shape or not torch.equal(got, expected):
        firsts = got[:, 0].tolist()
        wrong = next((k for k, i in enumerate(firsts) if i != k), len(firsts))
        sys.stderr.write(
            f"WRONG: {what}: {len(firsts)} samples, the first out of place at position {wrong}: "
            f"{firsts[wrong : wrong + 8]}\n"
        )
        sys.stderr.flush()
        sys.exit(WRONG)
    return (
        f"epoch {placement} {latency_ms:g} ms: {seconds:.2f} s, {samples} samples, io limit {limit}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("placement", choices=sorted(PLACEMENTS))
    parser.add_argument("latency_ms", type=float, nargs="+")
    parser.add_argument("--watchdog-s", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()
    watchdog = Watchdog(args.watchdog_s, "start-up")
    for latency_ms in args.latency_ms:
        print(epoch(args.placement, latency_ms, args.samples, watchdog), flush=True)


if __name__ == "__main__":
    main()
