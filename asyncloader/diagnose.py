"""Run your input pipeline alone and say where its time goes.

::

    python -m asyncloader.diagnose my_project.data:make_loader [--batches 200] [--step-ms 0]
        [--html report.html]

``module:factory`` names a function that returns an :class:`~asyncloader.AsyncLoader` (called
with no arguments). The loader runs for ``--batches`` batches (or one epoch, if shorter)
with no training step, or with ``--step-ms`` of simulated step per batch; a progress line
shows batches/s, samples/s and the share of the time spent waiting for data, then
:meth:`AsyncLoader.report` is printed: the stage that sets the pace, the evidence and the knob.
With no step the consumer never holds the loader back, so the report names the loader's own
bottleneck: the ceiling your training loop can get. ``--html`` also writes the report as a
page with a timeline of the stages (the run is traced: :func:`asyncloader.trace`).

For a loader that hangs, :func:`dump_state` says what each stage holds and where every task
and thread waits (``ASYNCLOADER_STALL_DUMP=<seconds>`` logs it by itself at a stall).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncloader._pipeline import dump_epochs
from asyncloader.loader import AsyncLoader
from asyncloader.trace import trace


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable ``module:name`` names (the current directory importable, as with -m)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"expected module:factory, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    factory: object = getattr(importlib.import_module(module_name), name)
    if not callable(factory):
        raise TypeError(f"{spec} is a {type(factory).__qualname__}, not a callable")
    return factory


def run(
    loader: AsyncLoader[Any],
    batches: int,
    step_s: float = 0.0,
    out: Any = None,
    html: str | None = None,
) -> str:
    """Takes up to ``batches`` batches (``step_s`` of sleep after each, as a training step),
    showing progress on ``out`` (stderr); returns the loader's report (also written to
    ``html`` as a page, see :meth:`AsyncLoader.report`)."""
    out = out or sys.stderr
    start = last = time.perf_counter()
    taken = 0
    with loader:
        for _ in loader:
            taken += 1
            if step_s:
                time.sleep(step_s)
            now = time.perf_counter()
            if now - last >= 0.5 or taken == batches:
                stats, elapsed = loader.stats, now - start
                out.write(
                    f"\r{taken} batches  {taken / elapsed:,.1f} batches/s  "
                    f"{stats.samples / elapsed:,.0f} samples/s  "
                    f"waiting for data {stats.stall_fraction:.0%}   "
                )
                out.flush()
                last = now
            if taken == batches:
                break
        out.write("\n")
        return loader.report(html=html)


class Replay:
    """A map-style dataset whose item ``i`` is ``samples[i % len(samples)]``, from memory,
    as long as ``length``: the samples of a pass that read them, for a pass without reading."""

    def __init__(self, samples: list[Any], length: int) -> None:
        self.samples, self.length = samples, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.samples[index % len(self.samples)]


class AsyncReplay(Replay):
    """:class:`Replay` for a dataset whose ``__getitem__`` is ``async def``."""

    async def __getitem__(self, index: int) -> Any:
        return self.samples[index % len(self.samples)]


@dataclass(frozen=True)
class Stalls:
    """Seconds per batch of each pass of :func:`stalls`, and what they say."""

    consumer: float  # the step alone (``--step-ms``), no loader
    in_memory: float  # the loader over samples already in memory: transform and collate
    cold: float  # the loader reading: fetch too

    @property
    def prep_stall(self) -> float:
        """Share of the cold step spent waiting on preprocessing (transform, collate)."""
        return max(0.0, self.in_memory - self.consumer) / self.cold if self.cold else 0.0

    @property
    def fetch_stall(self) -> float:
        """Share of the cold step spent waiting on the fetch (``__getitem__``: storage)."""
        return (
            max(0.0, self.cold - max(self.in_memory, self.consumer)) / self.cold
            if self.cold
            else 0.0
        )

    def verdict(self) -> str:
        fetch, prep = self.fetch_stall, self.prep_stall
        if max(fetch, prep) < 0.10:
            return "neither: the step sets the pace (the loader keeps up)"
        return "fetch-bound" if fetch >= prep else "CPU-bound (preprocessing)"

    def render(self) -> str:
        return (
            f"per batch: consumer alone {self.consumer * 1e3:.3g} ms, data in memory "
            f"{self.in_memory * 1e3:.3g} ms, reading cold {self.cold * 1e3:.3g} ms\n"
            f"fetch stall {self.fetch_stall:.0%} of the step, preprocessing stall "
            f"{self.prep_stall:.0%}: {self.verdict()}"
        )


def stalls(factory: Callable[[], Any], batches: int, step_s: float) -> Stalls:
    """The Data Stalls paper's three passes (DS-Analyzer, VLDB 2021) over ``batches``
    batches of the loaders ``factory`` makes: the consumer's step alone; the loader
    over the first samples held in memory (``__getitem__`` not called: what is left is
    transform, collate and the hand-over); and the loader reading cold. A map-style
    dataset's ``__getitem__`` counts as fetch, ``transform`` and ``collate`` as preprocessing.

    Raises:
        TypeError: The loader's dataset is not map-style.
    """
    cold_loader = factory()
    dataset = cold_loader.dataset
    if not hasattr(type(dataset), "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError("--stalls needs a map-style dataset (__getitem__ and __len__)")
    cold = _timed(cold_loader, batches, step_s)
    began = time.perf_counter()
    for _ in range(batches):
        _step(step_s)
    consumer = (time.perf_counter() - began) / batches
    size = min(len(dataset), 4096, batches * max(1, cold_loader.batch_size or 1))
    samples = _preload(dataset, size)
    replay = Replay if not inspect.iscoroutinefunction(type(dataset).__getitem__) else AsyncReplay
    memory_loader = factory()
    # The same loader, its dataset swapped before its first epoch for one of the same kind.
    object.__setattr__(memory_loader._options, "dataset", replay(samples, len(dataset)))
    in_memory = _timed(memory_loader, batches, step_s)
    return Stalls(consumer, in_memory, cold)


def _preload(dataset: Any, size: int) -> list[Any]:
    """Items ``0 .. size-1`` of ``dataset``; an ``async def __getitem__`` awaited 64 at once."""
    if not inspect.iscoroutinefunction(type(dataset).__getitem__):
        return [dataset[i] for i in range(size)]

    async def read() -> list[Any]:
        room = asyncio.Semaphore(64)

        async def one(i: int) -> Any:
            async with room:
                return await dataset[i]

        return list(await asyncio.gather(*(one(i) for i in range(size))))

    return asyncio.run(read())


def _step(step_s: float) -> None:
    """The simulated training step."""
    if step_s:
        time.sleep(step_s)


def _timed(loader: Any, batches: int, step_s: float) -> float:
    """Seconds per batch over up to ``batches`` batches after the first (start-up apart)."""
    taken, began = -1, 0.0
    with loader:
        for _ in loader:
            taken += 1
            if not taken:
                began = time.perf_counter()
            _step(step_s)
            if taken == batches:
                break
    return (time.perf_counter() - began) / max(taken, 1)


def dump_state(loader: AsyncLoader[Any]) -> str:
    """The state of ``loader``'s running epochs, for a report of a hang: per stage what is in
    flight, queued and parked (fetch, engine, reorder buffer, device stage, consumer), the
    limits and the window, the last moves of the ``"auto"`` tuners, then the tasks on the
    epochs' event loops and every thread's stack (threads or tasks at the same place shown
    once). From any thread: it reads and never changes the epoch, and waits at most about
    2 s for each event loop to answer (a blocked loop is read from the calling thread)."""
    epochs = sorted(loader._epochs, key=lambda epoch: epoch.start_info.number)
    title = f"asyncloader: the state of {type(loader).__name__} at {time.strftime('%H:%M:%S')}:"
    return dump_epochs(epochs, title)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m asyncloader.diagnose", description=__doc__.split("\n")[0]
    )
    parser.add_argument("factory", help="module:function returning an AsyncLoader")
    parser.add_argument("--batches", type=int, default=200, help="batches to take (200)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch")
    parser.add_argument(
        "--stalls",
        action="store_true",
        help="fetch-bound or CPU-bound? three passes: the consumer alone, the data in memory, "
        "reading cold",
    )
    parser.add_argument(
        "--html",
        help="also write the report as a page there, with a timeline; the run's trace goes "
        "beside it (PATH.trace.json, for https://ui.perfetto.dev)",
    )
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be >= 1")
    if args.stalls:
        print(stalls(load_factory(args.factory), args.batches, args.step_ms / 1000).render())
        return
    loader = load_factory(args.factory)()
    if not isinstance(loader, AsyncLoader):
        parser.error(f"{args.factory} returned a {type(loader).__qualname__}, not an AsyncLoader")
    if args.html is None:
        print(run(loader, args.batches, args.step_ms / 1000))
        return
    with trace(f"{args.html}.trace.json"):
        print(run(loader, args.batches, args.step_ms / 1000, html=args.html))
    print(f"wrote {args.html} and {args.html}.trace.json")


if __name__ == "__main__":
    main()
