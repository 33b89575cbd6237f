"""Reused shared-memory batch segments: CPU per image of ``ImageBatch`` in 2 workers, with the
workers' segment pools and without, against ``ImageBatch`` alone.

The data: ``--images`` JPEGs (``examples/image_data.make_images``: 1,536 distinct ones,
repeated), in memory as ``(jpeg, label)`` pairs, so that nothing but decoding and the batch's
way out of the worker costs CPU. Cases, each a fresh process, alternating, ``--reps`` rounds:

- ``alone``: ``ImageBatch(224)`` on lists of 64 in one process, one torch thread: the floor;
- ``reused``: ``AsyncLoader(pairs, batch_size=64, num_workers=2, collate_fn=ImageBatch(224))``
  as it is: each worker writes its batches into the shared-memory segments of batches the
  consumer has let go (``asyncloader._worker.buffers``). The consumer reads one value of
  every page of each batch, as a copy to the GPU reads them all (and as it must, for the
  training process's share of the segments to count in its memory);
- ``fresh``: the same with the workers' pools turned off: each batch a fresh 38 MB segment.

Reported per case: the median CPU ms per image of the whole process tree (``getrusage`` of
the process and its reaped children, worker start included), images/s, and minor page faults
per image, from runs left alone; reused/alone, fresh/alone; and the peak memory the run held
(``peak_held_gb`` of :func:`~benchmarks.side_by_side.in_fresh_process_sampled`: the process
tree's PSS without shared memory, plus the shared memory in use), from a second run of each
case sampled every 25 ms (sampling slows a run's page faults, so its times are not used).

``python -m benchmarks.probes.batch_buffers [--reps 5] [--images 6144] [--step-ms 0] [--save]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import side_by_side as summaries
from benchmarks.side_by_side import in_fresh_process, in_fresh_process_sampled

CASES = ("alone", "reused", "fresh")
BATCH = 64
DISTINCT = 1536
CACHE = Path(".cache/batch_buffers_images.pkl")
#: float32 values per 4 KiB page.
PAGE_FLOATS = 1024


def _usage() -> tuple[float, int]:
    """CPU seconds and minor faults of this process and its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return cpu, own.ru_minflt + kids.ru_minflt


def _pairs(n: int) -> list[tuple[bytes, int]]:
    if not CACHE.exists():
        sys.path.insert(0, "examples")
        from image_data import make_images

        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_bytes(pickle.dumps(make_images(DISTINCT)))
    images = pickle.loads(CACHE.read_bytes())
    pairs = [(jpeg, label) for _, jpeg, label in images]
    return (pairs * (n // len(pairs) + 1))[:n]


def with_pools(slots: int) -> None:
    """Workers started from now on keep up to ``slots`` segments each (0: none, a fresh
    segment per batch; by default the bound is the window + 2: docs/workers.md)."""
    from asyncloader._worker import plan

    made = plan.BatchPlan.of.__func__  # type: ignore[attr-defined]
    plan.BatchPlan.of = classmethod(  # type: ignore[method-assign]
        lambda cls, options: dataclasses.replace(made(cls, options), buffers=slots)
    )


def one(case: str, n: int, step_ms: float = 0.0) -> dict[str, Any]:
    """One run of ``case`` in this process; the consumer spends ``step_ms`` per batch (a
    training step that releases the GIL, as a GPU step does)."""
    import torch

    from asyncloader import AsyncLoader
    from asyncloader.images import ImageBatch

    pairs, collate = _pairs(n), ImageBatch(224)
    cpu0, faults0 = _usage()
    began = time.perf_counter()
    if case == "alone":
        torch.set_num_threads(1)
        for i in range(0, n, BATCH):
            collate(pairs[i : i + BATCH])
    else:
        if case == "fresh":
            with_pools(0)
        loader = AsyncLoader(pairs, batch_size=BATCH, num_workers=2, collate_fn=collate)
        seen = 0
        for images, labels in loader:
            images.view(-1)[::PAGE_FLOATS].sum()  # reads every page, as a copy to the GPU does
            if step_ms:
                time.sleep(step_ms / 1e3)
            seen += len(labels)
        loader.close()
        if seen != n:
            raise RuntimeError(f"{case}: {seen} images delivered, {n} expected")
    cpu, faults = _usage()
    return {
        "cpu_ms": (cpu - cpu0) / n * 1e3,
        "images_per_s": n / (time.perf_counter() - began),
        "faults": (faults - faults0) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--images", type=int, default=6144)
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="a consumer's step per batch (sleeps)"
    )
    parser.add_argument("--one", choices=CASES, help=argparse.SUPPRESS)
    summaries.add_save_argument(parser, "batch_buffers")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.images, args.step_ms)))
        return
    runs = measure(args.reps, args.images, args.step_ms)
    text = table(runs, args.reps, args.images, args.step_ms)
    print(text)
    if args.save:
        medians = {case: _medians(rs) for case, rs in runs.items()}
        alone = medians["alone"]["cpu_ms"]
        summary = {
            "reps": args.reps,
            "images": args.images,
            "step_ms": args.step_ms,
            "medians": medians,
            "cpu_x_alone": {case: m["cpu_ms"] / alone for case, m in medians.items()},
            "runs": runs,
            "table": text,
        }
        summaries.save(args.save, summary)


def measure(reps: int, images: int, step_ms: float) -> dict[str, list[dict[str, Any]]]:
    """Each case ``reps`` times, alternating: a run left alone for the times, then a sampled
    one for the memory."""
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for rep in range(reps):
        for case in CASES if rep % 2 == 0 else CASES[::-1]:
            args_of = ("benchmarks.probes.batch_buffers", "--one", case, "--images", images)
            args_of += ("--step-ms", step_ms)
            timed = in_fresh_process(*args_of)
            sampled = in_fresh_process_sampled(*args_of)
            runs[case].append({**timed, "peak_held_gb": sampled["peak_held_gb"]})
    return runs


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def table(runs: dict[str, list[dict[str, Any]]], reps: int, images: int, step_ms: float) -> str:
    """The medians per case, and each run's CPU and memory."""
    medians = {case: _medians(rs) for case, rs in runs.items()}
    alone = medians["alone"]["cpu_ms"]
    lines = [
        f"ImageBatch(224), {images} in-memory JPEGs, batch {BATCH}, step {step_ms} ms; medians "
        f"of {reps} fresh processes each, alternating",
        f"  {'case':8s} {'CPU ms/image':>12s} {'images/s':>9s} {'faults/image':>12s} "
        f"{'vs alone':>9s} {'peak GB':>8s}",
    ]
    for case, m in medians.items():
        lines.append(
            f"  {case:8s} {m['cpu_ms']:12.3f} {m['images_per_s']:9.0f} {m['faults']:12.1f} "
            f"{m['cpu_ms'] / alone - 1:+8.0%} {m['peak_held_gb']:8.2f}"
        )
    for key, name in (("cpu_ms", "CPU ms/image"), ("peak_held_gb", "peak GB")):
        per_run = {c: [round(r[key], 2) for r in rs] for c, rs in runs.items()}
        lines.append(f"  per-run {name}: {per_run}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
