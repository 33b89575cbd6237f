"""What a Ray actor call costs the caller: one batch per call against several (issue 16).

Two async actors on a local 2-CPU Ray instance answer calls after ``asyncio.sleep(0.02)``
with 32 x 1024-float batches (the io workload's), 32 batches in flight; the driver sends
either one batch per call or ``--per-call`` batches per call (answered as one list), and
measures batches/s and its own CPU per batch. This is why :mod:`asyncloader.ray` sends
requests several to a call.

``python -m benchmarks.probes.ray_calls [--reps 3] [--per-call 8] [--batches 4000]``
(each rep a fresh process per mode, alternating; medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any

from benchmarks import side_by_side

IN_FLIGHT = 32
SHAPE = (32, 1024)


class _Actor:
    async def answer(self, seqs: list[int]) -> list[Any]:
        import numpy as np

        await asyncio.sleep(0.02)
        return [np.full(SHAPE, s, dtype=np.float32) for s in seqs]


def _one(per_call: int, batches: int) -> dict[str, float]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actors = [ray.remote(num_cpus=1)(_Actor).remote() for _ in range(2)]
    ray.get([a.answer.remote([0]) for a in actors])
    room, done = threading.Semaphore(IN_FLIGHT), threading.Semaphore(0)

    def answered(future: Any) -> None:
        for _ in future.result():
            room.release()
            done.release()

    t0, cpu0 = time.perf_counter(), time.process_time()
    for first in range(0, batches, per_call):
        for _ in range(per_call):
            room.acquire()
        seqs = list(range(first, first + per_call))
        ref = actors[(first // per_call) % 2].answer.remote(seqs)
        ref.future().add_done_callback(answered)
    for _ in range(batches):
        done.acquire()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ray.shutdown()
    return {"batches_per_s": batches / wall, "driver_cpu_ms_per_batch": cpu / batches * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--per-call", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.batches)))
        return
    modes = {1: [], args.per_call: []}
    for _ in range(args.reps):
        for per_call, runs in modes.items():
            one = ("benchmarks.probes.ray_calls", "--one", per_call, "--batches", args.batches)
            runs.append(side_by_side.in_fresh_process(*one))
    print(f"{args.batches} batches, {IN_FLIGHT} in flight, {args.reps} fresh processes (medians)")
    for per_call, runs in modes.items():
        rate = statistics.median(r["batches_per_s"] for r in runs)
        cpu = statistics.median(r["driver_cpu_ms_per_batch"] for r in runs)
        print(f"  {per_call:2d} per call: {rate:7.0f} batches/s, driver {cpu:.3f} ms CPU/batch")


if __name__ == "__main__":
    main()
