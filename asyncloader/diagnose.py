"""Run your input pipeline alone and say where its time goes.

::

    python -m asyncloader.diagnose my_project.data:make_loader [--batches 200] [--step-ms 0]

``module:factory`` names a function that returns an :class:`~asyncloader.AsyncLoader` (called
with no arguments). The loader runs for ``--batches`` batches (or one epoch, if shorter)
with no training step, or with ``--step-ms`` of simulated step per batch; a progress line
shows batches/s, samples/s and the share of the time spent waiting for data, then
:meth:`AsyncLoader.report` is printed: the stage that sets the pace, the evidence and the knob.
With no step the consumer never holds the loader back, so the report names the loader's own
bottleneck: the ceiling your training loop can get.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

from asyncloader.loader import AsyncLoader


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable ``module:name`` names (the current directory importable, as with -m)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"expected module:factory, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    factory = getattr(importlib.import_module(module_name), name)
    if not callable(factory):
        raise TypeError(f"{spec} is a {type(factory).__qualname__}, not a callable")
    return factory


def run(loader: AsyncLoader, batches: int, step_s: float = 0.0, out: Any = None) -> str:
    """Takes up to ``batches`` batches (``step_s`` of sleep after each, as a training step),
    showing progress on ``out`` (stderr); returns the loader's report."""
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
        return loader.report()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m asyncloader.diagnose", description=__doc__.split("\n")[0]
    )
    parser.add_argument("factory", help="module:function returning an AsyncLoader")
    parser.add_argument("--batches", type=int, default=200, help="batches to take (200)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch")
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be >= 1")
    loader = load_factory(args.factory)()
    if not isinstance(loader, AsyncLoader):
        parser.error(f"{args.factory} returned a {type(loader).__qualname__}, not an AsyncLoader")
    print(run(loader, args.batches, args.step_ms / 1000))


if __name__ == "__main__":
    main()
