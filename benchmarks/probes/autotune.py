"""``io_concurrency="auto"`` against a sweep of fixed settings, and against a change of latency.

Sweep: the io workload's samples (1024 bytes, batch 32, ``async def __getitem__``) at 2, 20
and 100 ms per sample, each setting (``io_concurrency`` 16, 64, 256, 1024, 4096, ``"auto"``)
in a fresh process, the settings alternating, ``--reps`` times. A run takes samples for
``--seconds`` (one epoch far longer than that) and reports samples/s over the whole run (the
climb included: a first epoch) and over its last half (where a tuned loader has settled).

Epochs (``--epochs``): whole epochs that must end. Per latency, one pilot run of each fixed
setting (``--seconds`` of a long epoch) picks the best; then that setting and "auto"
alternate ``--reps`` times over whole epochs of as many samples as the best fixed setting
takes about ``--seconds`` to fetch, each in a fresh process that must end within 20 times
that. Reports samples/s per epoch (medians, lowest and highest) and how many runs ended.

Shift: one "auto" run whose latency goes from 5 ms to 50 ms after ``--seconds`` seconds;
prints samples/s per 0.5 s bin and how long after the shift it reached 0.9x the best fixed
setting's steady rate at 50 ms (measured in the same invocation).

``python -m benchmarks.probes.autotune [--reps 3] [--seconds 6] [--latencies MS...]
[--no-shift] [--epochs] [--save [SECTION]] [--toy]``; with each latency's medians it prints
the spread: auto / best fixed in each rep, lowest to highest. ``--toy``: one round of 64
against "auto" at 50 ms for 0.5 s (with the shift), to check that it still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from typing import Any

import numpy as np

from benchmarks import side_by_side
from benchmarks.side_by_side import in_fresh_process

SETTINGS = ["16", "64", "256", "1024", "4096", "auto"]
LATENCIES_MS = [2, 20, 100]
BATCH, ITEMS = 32, 10_000_000


class Latency:
    """Sample ``i`` (1024 bytes) after ``latency_s``, or after ``then_s`` once ``switch_at``
    (a ``perf_counter`` time) has passed."""

    def __init__(
        self,
        latency_s: float,
        then_s: float | None = None,
        switch_at: float = 0.0,
        items: int = ITEMS,
    ) -> None:
        self.latency_s, self.then_s, self.switch_at = latency_s, then_s, switch_at
        self.items = items

    def __len__(self) -> int:
        return self.items

    async def __getitem__(self, i: int) -> np.ndarray:
        late = self.then_s is not None and time.perf_counter() >= self.switch_at
        await asyncio.sleep(self.then_s if late else self.latency_s)
        return np.full(1024, i % 251, np.uint8)


def timed_run(
    source: Latency, seconds: float, **options: Any
) -> tuple[list[tuple[float, int]], Any]:
    """``(seconds since start, samples so far)`` after each batch, for ``seconds`` of one
    epoch of a loader with ``options``; and the loader's stats then."""
    from asyncloader import AsyncLoader

    loader = AsyncLoader(source, batch_size=BATCH, **options)
    start, got, marks = time.perf_counter(), 0, []
    with loader:
        for batch in loader:
            got += len(batch)
            at = time.perf_counter() - start
            marks.append((at, got))
            if at >= seconds:
                break
        return marks, loader.stats


def io_setting(setting: str) -> int | str:
    return setting if setting == "auto" else int(setting)


def rates(marks: list[tuple[float, int]]) -> tuple[float, float]:
    """Samples/s over the whole run and over its last half."""
    end, total = marks[-1]
    half = next((m for m in marks if m[0] >= end / 2), marks[0])
    return total / end, (total - half[1]) / max(end - half[0], 1e-9)


def whole_epoch(source: Latency, **options: Any) -> float:
    """Samples/s of one whole epoch of ``source``; checks that each sample came once."""
    from asyncloader import AsyncLoader

    start, got = time.perf_counter(), 0
    with AsyncLoader(source, batch_size=BATCH, **options) as loader:
        for batch in loader:
            got += len(batch)
    assert got == len(source), f"{got} samples of {len(source)}"
    return got / (time.perf_counter() - start)


def child(args: argparse.Namespace) -> None:
    if args.items:
        source = Latency(args.latency_ms / 1000, items=args.items)
        print(json.dumps({"rate": whole_epoch(source, io_concurrency=io_setting(args.setting))}))
        return
    if args.shift:
        source = Latency(0.005, 0.050, time.perf_counter() + args.seconds)
        marks, _ = timed_run(source, args.seconds * 2, io_concurrency="auto")
        print(json.dumps(marks))
        return
    source, io = Latency(args.latency_ms / 1000), io_setting(args.setting)
    whole, steady = rates(timed_run(source, args.seconds, io_concurrency=io)[0])
    print(json.dumps({"whole": whole, "steady": steady}))


MODULE = "benchmarks.probes.autotune"


def sweep(ms: int, reps: int, seconds: float, settings: list[str]) -> dict:
    """Every setting at ``ms`` per sample, ``reps`` rounds; prints and returns the medians,
    the best fixed setting and the spread (auto / best fixed, per round)."""
    common = ["--child", "--latency-ms", ms, "--seconds", seconds]
    runs = side_by_side.rounds(
        settings, reps, lambda s: in_fresh_process(MODULE, *common, "--setting", s)
    )
    table = side_by_side.medians(runs, ("whole", "steady"))
    best = max((s for s in settings if s != "auto"), key=lambda s: table[s]["steady"])
    spread = {k: side_by_side.paired(runs, best, k)["auto"] for k in ("whole", "steady")}
    print(f"\n{ms} ms per sample: samples/s, medians of {reps} (whole run / last half)")
    for s in settings:
        print(f"  {s:>5}  {table[s]['whole']:9,.0f}  {table[s]['steady']:9,.0f}")
    auto, top = table["auto"], table[best]
    print(
        f"  auto / best fixed ({best}): {auto['whole'] / top['whole']:.2f} whole, "
        f"{auto['steady'] / top['steady']:.2f} steady; per rep "
        f"{spread['whole'][0]:.2f}-{spread['whole'][-1]:.2f} whole, "
        f"{spread['steady'][0]:.2f}-{spread['steady'][-1]:.2f} steady"
    )
    return {"table": table, "best_fixed": best, "auto_per_rep": spread}


def epochs(ms: int, reps: int, seconds: float, settings: list[str]) -> dict:
    """Whole epochs of the best fixed setting (from one pilot run each) against "auto", at
    ``ms`` per sample; every run must end (see the module docstring)."""
    common = ["--child", "--latency-ms", ms, "--seconds", seconds]
    pilot = {
        s: in_fresh_process(MODULE, *common, "--setting", s)["steady"]
        for s in settings
        if s != "auto"
    }
    best = max(pilot, key=lambda s: pilot[s])
    items = max(BATCH, int(pilot[best] * seconds) // BATCH * BATCH)

    def whole(setting: str) -> float | None:
        """One whole epoch's samples/s, or None if it did not end in 20 times its budget."""
        args = ["--setting", setting, "--items", items]
        try:
            return in_fresh_process(MODULE, *common, *args, timeout_s=20 * seconds + 30)["rate"]
        except subprocess.TimeoutExpired:
            return None

    runs = side_by_side.rounds([best, "auto"], reps, whole)
    result: dict[str, Any] = {"best_fixed": best, "items": items, "pilot": pilot}
    print(f"\n{ms} ms per sample: whole epochs of {items:,} samples, samples/s over {reps} runs")
    for setting, rates_ in runs.items():
        ended = [r for r in rates_ if r is not None]
        median = side_by_side.medians({setting: [{"rate": r} for r in ended]}, ["rate"])[setting]
        result[setting] = {
            "median": median.get("rate"),
            "low": min(ended, default=None),
            "high": max(ended, default=None),
            "ended": len(ended),
            "runs": rates_,
        }
        print(
            f"  {setting:>5}  median {result[setting]['median'] or 0:9,.0f}  "
            f"({result[setting]['low'] or 0:,.0f}-{result[setting]['high'] or 0:,.0f}), "
            f"{len(ended)} of {reps} ended"
        )
    if result["auto"]["median"] and result[best]["median"]:
        result["auto_over_best"] = result["auto"]["median"] / result[best]["median"]
        print(f"  auto / best fixed ({best}): {result['auto_over_best']:.2f}")
    return result


def shift(seconds: float, at_50ms: dict) -> dict:
    """One "auto" run whose latency goes from 5 to 50 ms after ``seconds``: its rate per
    0.5 s and how long after the change it reached 0.9x the best fixed rate at 50 ms."""
    target = 0.9 * at_50ms["table"][at_50ms["best_fixed"]]["steady"]
    marks = in_fresh_process(MODULE, "--child", "--shift", "--seconds", seconds)
    bins, recovered, last = [], None, (0.0, 0)
    for at, got in marks:
        if at - last[0] >= 0.5:
            rate = (got - last[1]) / (at - last[0])
            bins.append((round(at, 2), round(rate)))
            if recovered is None and at > seconds + 0.5 and rate >= target:
                recovered = at - seconds
            last = (at, got)
    print(f"\nshift 5 -> 50 ms at {seconds} s (auto): samples/s per 0.5 s {bins}")
    print(f"  0.9x best fixed at 50 ms = {target:,.0f}/s reached {recovered} s after the shift")
    return {"bins": bins, "target": target, "recovered_after_s": recovered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    side_by_side.add_save_argument(parser, "autotune")
    parser.add_argument("--toy", action="store_true", help="64 against auto, 0.5 s, 50 ms")
    parser.add_argument(
        "--latencies", type=int, nargs="+", default=[*LATENCIES_MS, 50], metavar="MS"
    )
    parser.add_argument("--no-shift", action="store_true", help="skip the latency change")
    parser.add_argument(
        "--epochs", action="store_true", help="whole epochs: best fixed against auto"
    )
    parser.add_argument("--items", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--latency-ms", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--shift", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    settings = SETTINGS
    if args.toy:
        args.reps, args.seconds, args.latencies, settings = 1, 0.5, [50], ["64", "auto"]
    if args.epochs:
        found = {ms: epochs(ms, args.reps, args.seconds, settings) for ms in args.latencies}
        if args.save:
            side_by_side.save(args.save, found)
        return
    summary: dict = {"sweep": {}, "shift": {}}
    for ms in args.latencies:
        summary["sweep"][ms] = sweep(ms, args.reps, args.seconds, settings)
    if not args.no_shift and 50 in summary["sweep"]:
        summary["shift"] = shift(args.seconds, summary["sweep"][50])
    if args.save:
        side_by_side.save(args.save, summary)


if __name__ == "__main__":
    main()
