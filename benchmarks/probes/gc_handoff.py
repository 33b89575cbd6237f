"""Python's collector and a thread that makes batches of rows ahead of their consumer.

Each batch is ``to_pylist()`` of 256 rows (an ``id``, 128 ``int32`` tokens): 512 containers
the collector tracks. Made and dropped in one loop, every batch frees what the one before
allocated, and the collector's count of new containers stays under its threshold (700).
Made on a thread that runs ``W`` batches ahead through a ``queue.Queue(W)``, the count
passes the threshold while the thread runs ahead, the collection resets it to 0, and the
frees that follow (counted down only above 0) are lost: with ``W >= 2`` about one collection
a batch or two, each walking the young rows. A loader that keeps batches of Python rows made
ahead pays this; one that makes the rows as they are taken does not.

The last case keeps the columns ahead and makes each batch's rows on the consumer's thread
as it takes it: the collections of the one loop, with the columns still made ahead.

Prints, per case, the generation-0 collections over ``--batches`` batches and the time of
the run (medians of ``--reps``, in this process).

``python -m benchmarks.probes.gc_handoff [--batches 500] [--reps 3] [--toy]``
"""

from __future__ import annotations

import argparse
import gc
import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def table() -> Any:
    import pyarrow as pa

    tokens = pa.array([[t % 50000 for t in range(i, i + 128)] for i in range(256)])
    return pa.table({"id": list(range(256)), "tokens": tokens.cast(pa.list_(pa.int32()))})


Case = Callable[[Any, int], None]  # (the table, batches)


def one_loop(columns: Any, batches: int) -> None:
    for _ in range(batches):
        for _row in columns.to_pylist():
            pass


def ahead(window: int) -> Case:
    """A producer thread ``window`` batches ahead of the consumer (this thread)."""

    def run(columns: Any, batches: int) -> None:
        made: queue.Queue[list | None] = queue.Queue(window)

        def produce() -> None:
            for _ in range(batches):
                made.put(columns.to_pylist())
            made.put(None)

        thread = threading.Thread(target=produce)
        thread.start()
        while (batch := made.get()) is not None:
            for _row in batch:
                pass
        thread.join()

    return run


def rows_when_taken(window: int) -> Case:
    """The thread ``window`` batches ahead with the columns; the rows made as each is taken
    (on the consumer's thread)."""

    def run(columns: Any, batches: int) -> None:
        made: queue.Queue[Any] = queue.Queue(window)

        def produce() -> None:
            for _ in range(batches):
                made.put(columns.slice(0))
            made.put(None)

        thread = threading.Thread(target=produce)
        thread.start()
        while (block := made.get()) is not None:
            for _row in block.to_pylist():
                pass
        thread.join()

    return run


def measure(case: Case, batches: int) -> tuple[int, float]:
    """Generation-0 collections and seconds of one run of ``case``."""
    columns, count = table(), [0]

    def counted(phase: str, info: dict[str, Any]) -> None:
        count[0] += phase == "start" and info["generation"] == 0

    gc.collect()
    gc.callbacks.append(counted)
    try:
        t0 = time.perf_counter()
        case(columns, batches)
        return count[0], time.perf_counter() - t0
    finally:
        gc.callbacks.remove(counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--toy", action="store_true", help="20 batches, one rep")
    args = parser.parse_args()
    if args.toy:
        args.batches, args.reps = 20, 1
    cases = {
        "one loop": one_loop,
        **{f"thread, queue({w})": ahead(w) for w in (1, 2, 4, 8)},
        "thread, queue(8) of columns, rows made when taken": rows_when_taken(8),
    }
    print(f"{args.batches} batches of 256 rows; medians of {args.reps}")
    for name, case in cases.items():
        runs = [measure(case, args.batches) for _ in range(args.reps)]
        collections = statistics.median(r[0] for r in runs)
        seconds = statistics.median(r[1] for r in runs)
        print(f"  {name:50s} gen0 collections {collections:6.0f}  {seconds:6.2f} s")


if __name__ == "__main__":
    main()
