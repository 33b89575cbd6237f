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
import importlib
import sys
import time
from collections.abc import Callable
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
        "--html",
        help="also write the report as a page there, with a timeline; the run's trace goes "
        "beside it (PATH.trace.json, for https://ui.perfetto.dev)",
    )
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be >= 1")
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
