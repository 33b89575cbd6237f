"""What bringing batches from Ray actors costs, by transport: actor calls against a
compiled graph (Ray's shared-memory channels, no task submission per call).

Two actors on a local 2-CPU Ray instance answer lists of 32 x 1024-float batches (the io
workload's) back to back, with no latency: what is measured is the transport alone. Each
request carries ``n`` batches, by an actor call (``.remote()``, the result through the object
store) or by a compiled graph's ``execute()``; the driver keeps one request per actor in
flight and records batches/s and the CPU of the driver and of the actors (psutil) per batch.

``python -m benchmarks.probes.ray_transport [--reps 3] [--batches 4000] [--save [SECTION]]``
(each rep a fresh process per case, alternating; medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from benchmarks import side_by_side
from benchmarks import side_by_side as summaries

SHAPE = (32, 1024)
CASES = (("call", 1), ("compiled", 1), ("call", 8), ("compiled", 8))


class _Actor:
    def answer(self, seqs: list[int]) -> list[Any]:
        import numpy as np

        return [np.full(SHAPE, s, dtype=np.float32) for s in seqs]


def _actor_role(process: Any, command: str) -> str | None:
    return "actors" if "_Actor" in command else None


def _one(transport: str, per: int, batches: int) -> dict[str, float]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # 127.0.0.1 only
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actors = [ray.remote(num_cpus=1)(_Actor).remote() for _ in range(2)]
    ray.get([a.answer.remote([0]) for a in actors])
    if transport == "compiled":
        from ray.dag import InputNode

        graphs = []
        for actor in actors:
            with InputNode() as request:
                graphs.append(actor.answer.bind(request).experimental_compile())
        send = [graph.execute for graph in graphs]
    else:
        send = [actor.answer.remote for actor in actors]
    from benchmarks.run_one import cpu_between, cpu_by_role

    t0, cpu0, actors0 = time.perf_counter(), time.process_time(), cpu_by_role(_actor_role)
    for first in range(0, batches, 2 * per):
        refs = [send[i](list(range(first + i * per, first + (i + 1) * per))) for i in (0, 1)]
        for ref in refs:
            assert len(ray.get(ref)) == per
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    actors_spent = cpu_between(actors0, cpu_by_role(_actor_role)).get("actors", 0.0)
    out = {
        "batches_per_s": batches / wall,
        "driver_cpu_ms_per_batch": cpu / batches * 1e3,
        "actors_cpu_ms_per_batch": actors_spent / batches * 1e3,
    }
    if transport == "compiled":
        for graph in graphs:
            graph.teardown()
    ray.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4000)
    summaries.add_save_argument(parser, "ray_transport")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.batches)))
        return
    runs: dict[tuple[str, int], list[dict]] = {case: [] for case in CASES}
    for _ in range(args.reps):
        for transport, per in CASES:
            one = ("benchmarks.probes.ray_transport", "--one", transport, per)
            runs[transport, per].append(
                side_by_side.in_fresh_process(*one, "--batches", args.batches)
            )
    medians = {
        f"{t} x{per}": {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for (t, per), rs in runs.items()
    }
    print(f"{args.batches} batches of {SHAPE}, {args.reps} fresh processes each (medians)")
    for name, m in medians.items():
        print(
            f"  {name:12s} {m['batches_per_s']:7.0f} batches/s, CPU ms/batch: driver "
            f"{m['driver_cpu_ms_per_batch']:.3f}, actors {m['actors_cpu_ms_per_batch']:.3f}"
        )
    if args.save:
        summaries.save(args.save, {"batches": args.batches, "medians": medians})


if __name__ == "__main__":
    main()
