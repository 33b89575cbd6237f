"""``num_workers="auto"`` and ``prefetch="auto"`` against fixed settings, and each "auto"
against its option's default on every benchmark workload.

Parts (``--part``, all by default), each run in a fresh process, settings alternating,
``--reps`` times; medians, and ratios to the best fixed setting or to the default:

- ``cpu``: the benchmark's cpu workload (2000 samples, batch 32, ~1.5 ms of pure Python per
  sample in ``transform``; one epoch, every batch checked): ``num_workers`` 1, 2, 3, 4
  (``prefetch`` 2) against ``num_workers="auto", prefetch="auto"``. Items/s over the epoch,
  worker start included, as the benchmark counts it.
- ``io``: the io workload's samples (1024 bytes, batch 32, ``async def __getitem__``) at 2,
  20 and 100 ms per sample, ``--seconds`` of one long epoch as in
  :mod:`benchmarks.probes.autotune`: ``io_concurrency`` 64, 256, 1024, 4096 (the defaults
  otherwise) against everything ``"auto"`` (``io_concurrency``, ``num_workers``,
  ``prefetch``). Samples/s over the whole run and its last half; for "auto" also where it
  settled and the most bytes it held (samples being fetched plus batches ahead of the
  consumer, an upper bound) against ``memory_budget``.
- ``lumpy``: the cpu workload's samples with uneven work: every 16th batch takes
  ``LUMP`` (10) times as long (a slow shard, a large image). In order, a slow batch holds
  the window's other slots once they are done, so the other worker idles unless the window
  is deeper: ``prefetch`` 2, 4, 8, 16 (2 workers) against ``prefetch="auto"``, one epoch of
  ``LUMPY_ITEMS`` samples.
- ``epochs``: the cpu workload for ``EPOCHS`` epochs under a consumer whose step takes
  ``STEP_MS`` per batch (a training step that one worker keeps up with):
  ``num_workers="auto"`` against 2 workers; per epoch the workers used and the samples/s,
  and the CPU seconds of the whole run (the process tree's).
- ``defaults``: every workload of :mod:`benchmarks.workloads` (io, http, cpu, big, overhead),
  configured as the benchmark configures asyncloader (io/http at ``io_concurrency=64``,
  cpu/big/overhead with 2 workers), with one option at a time at its fixed default and at
  ``"auto"``: ``io_concurrency`` (64), ``prefetch`` (2, the default before this probe made
  ``"auto"`` the default), ``num_workers`` (0); ``--knobs`` picks some.
- ``nofile`` (not in the default parts): the http workload at ``io_concurrency`` 64 and
  ``"auto"`` in clients at the usual soft open-files limit of 1,024 (a request in flight may
  hold a socket; "auto" must stay within it).

``python -m benchmarks.probes.autosize [--part cpu io lumpy epochs defaults nofile] [--reps 3]
[--seconds 6] [--knobs KNOB...] [--save [PREFIX]]`` (``--save`` records each part's summary
as its own section, ``PREFIX/PART``)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import side_by_side as summaries
from benchmarks.checks import Checker
from benchmarks.loaders import asyncloader_options
from benchmarks.probes.autotune import Latency, rates, timed_run
from benchmarks.run_one import measure, prepare, tree_cpu_seconds
from benchmarks.side_by_side import in_fresh_process
from benchmarks.workloads import CPU_SHAPE, WORKLOADS, MemorySource, burn, http_server

MODULE = "benchmarks.probes.autosize"
AUTO = {"io_concurrency": "auto", "num_workers": "auto", "prefetch": "auto"}
CPU_SETTINGS: dict[str, dict[str, Any]] = {
    **{f"workers {n}": {"num_workers": n} for n in (1, 2, 3, 4)},
    "auto": {"num_workers": "auto", "prefetch": "auto"},
}
IO_SETTINGS: dict[str, dict[str, Any]] = {
    **{f"io {n}": {"io_concurrency": n} for n in (64, 256, 1024, 4096)},
    "auto": AUTO,
}
LATENCIES_MS = (2, 20, 100)
NOFILE = 1024  # the usual soft limit of open files (ulimit -n)
LUMP, LUMP_EVERY, LUMPY_ITEMS = 10, 16, 6000
EPOCHS, STEP_MS = 4, 60
EPOCH_SETTINGS: dict[str, dict[str, Any]] = {"workers 2": {"num_workers": 2}, "auto": {}}
LUMPY_SETTINGS: dict[str, dict[str, Any]] = {
    **{f"prefetch {n}": {"prefetch": n} for n in (2, 4, 8, 16)},
    "auto": {"prefetch": "auto"},
}
#: knob -> (its fixed default, "auto"); prefetch's default is "auto" since this measurement
KNOBS = {"io_concurrency": (64, "auto"), "prefetch": (2, "auto"), "num_workers": (0, "auto")}


def lumpy(sample: np.ndarray) -> np.ndarray:
    """``burn``, ``LUMP`` times over for the samples of every ``LUMP_EVERY``-th batch."""
    index = int.from_bytes(sample[:4].tobytes(), "little")
    for _ in range(LUMP if (index // WORKLOADS["cpu"].batch) % LUMP_EVERY == 0 else 1):
        burn(sample)
    return sample


def settled(stats: Any) -> dict[str, Any]:
    """Where the "auto" settings ended, and the most bytes the loader held."""
    sample = 1024
    held = stats.max_fetching * sample + stats.max_ahead * stats.batch_bytes
    return {
        "num_workers": stats.num_workers,
        "prefetch": stats.prefetch,
        "fetch_limit": stats.fetch_limit,
        "held_bytes": held,
    }


def epoch_run(
    workload: str, setting: int, overrides: dict[str, Any], port: int | None
) -> dict[str, Any]:
    """One benchmark epoch of asyncloader with the benchmark's options at ``setting``
    (io_concurrency or num_workers), ``overrides`` replacing some."""
    from asyncloader import AsyncLoader

    spec = WORKLOADS[workload]
    options = {**asyncloader_options(spec, setting), **overrides}
    _, checker, dataset = prepare("asyncloader", workload, spec.items, port)
    box: list[Any] = []

    @contextlib.contextmanager
    def build():
        loader = AsyncLoader(dataset, **options)
        box.append(loader)
        with loader, contextlib.closing(iter(loader)) as it:
            yield it

    result = measure(build(), checker)
    return {**result, **settled(box[0].stats)}


def io_run(latency_ms: float, options: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``seconds`` of one long epoch of the io samples at ``latency_ms``: samples/s."""
    marks, stats = timed_run(Latency(latency_ms / 1000), seconds, **options)
    whole, steady = rates(marks)
    return {"whole": whole, "steady": steady, **settled(stats), "budget": 1 << 30}


def lumpy_run(options: dict[str, Any]) -> dict[str, Any]:
    """One epoch of ``LUMPY_ITEMS`` cpu samples through :func:`lumpy`, 2 workers."""
    from asyncloader import AsyncLoader

    dataset, checker = MemorySource(LUMPY_ITEMS), Checker(LUMPY_ITEMS, CPU_SHAPE)
    box: list[Any] = []

    @contextlib.contextmanager
    def build():
        loader = AsyncLoader(
            dataset, batch_size=WORKLOADS["cpu"].batch, num_workers=2, transform=lumpy, **options
        )
        box.append(loader)
        with loader, contextlib.closing(iter(loader)) as it:
            yield it

    return {**measure(build(), checker), **settled(box[0].stats)}


def epochs_run(options: dict[str, Any]) -> dict[str, Any]:
    """``EPOCHS`` epochs of the cpu workload under a ``STEP_MS`` consumer step."""
    from asyncloader import AsyncLoader

    items = WORKLOADS["cpu"].items
    settings = {**asyncloader_options(WORKLOADS["cpu"], 2), "num_workers": "auto", **options}
    loader = AsyncLoader(MemorySource(items), **settings)
    cpu0, per_epoch = tree_cpu_seconds(), []
    with loader:
        for _ in range(EPOCHS):
            checker = Checker(items, CPU_SHAPE)
            start = time.perf_counter()
            for batch in loader:
                checker.add(batch)
                time.sleep(STEP_MS / 1000)  # the training step
            checker.verify()
            rate = items / (time.perf_counter() - start)
            per_epoch.append({"workers": loader.stats.num_workers, "items_per_s": rate})
    return {"epochs": per_epoch, "cpu_s": tree_cpu_seconds() - cpu0}


def child(args: argparse.Namespace) -> None:
    case = json.loads(args.case)
    if case["part"] == "epochs":
        out = epochs_run(case["options"])
    elif case["part"] == "lumpy":
        out = lumpy_run(case["options"])
    elif case["part"] == "io":
        out = io_run(case["latency_ms"], case["options"], case["seconds"])
    else:
        out = epoch_run(case["workload"], case["setting"], case["options"], case.get("port"))
    print(json.dumps(out))


def runs(cases: dict[str, dict[str, Any]], reps: int) -> dict[str, list[dict]]:
    """Every case ``reps`` times in fresh processes, the cases alternating."""
    out: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, case in cases.items():
            out[name].append(in_fresh_process(MODULE, "--child", "--case", json.dumps(case)))
    return out


def medians(results: list[dict], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in results) for k in keys}


def cpu_part(reps: int) -> dict[str, Any]:
    cases = {
        name: {"part": "cpu", "workload": "cpu", "setting": 2, "options": extra}
        for name, extra in CPU_SETTINGS.items()
    }
    return against_fixed("cpu", cases, ("items_per_s",), reps)


def lumpy_part(reps: int) -> dict[str, Any]:
    cases = {name: {"part": "lumpy", "options": o} for name, o in LUMPY_SETTINGS.items()}
    return against_fixed("lumpy", cases, ("items_per_s", "steady_items_per_s"), reps)


def against_fixed(
    part: str, cases: dict[str, dict[str, Any]], keys: tuple[str, ...], reps: int
) -> dict[str, Any]:
    """Runs ``cases`` (fixed settings and "auto"); prints and returns their medians of
    ``keys`` and "auto" over the best fixed setting (by items/s over the epoch)."""
    got = runs(cases, reps)
    table = {name: medians(r, keys) for name, r in got.items()}
    best = max((n for n in table if n != "auto"), key=lambda n: table[n]["items_per_s"])
    ratio = table["auto"]["items_per_s"] / table[best]["items_per_s"]
    print(f"\n{part}: {' / '.join(keys)}, medians of {reps}")
    for name, row in table.items():
        print(f"  {name:>11}  " + "  ".join(f"{row[k]:8,.0f}" for k in keys))
    auto = got["auto"]
    print(f"  auto / best fixed ({best}): {ratio:.2f}; auto ran {auto[0]['num_workers']} "
          f"workers, prefetch ended at {[r['prefetch'] for r in auto]}")  # fmt: skip
    return {"table": table, "best_fixed": best, "auto_over_best": ratio, "runs": got}


def epochs_part(reps: int) -> dict[str, Any]:
    cases = {name: {"part": "epochs", "options": o} for name, o in EPOCH_SETTINGS.items()}
    got = runs(cases, reps)
    table = {}
    print(f"\nepochs: {EPOCHS} epochs of cpu under a {STEP_MS} ms step, medians of {reps}")
    for name, results in got.items():
        rates = [statistics.median(r["epochs"][e]["items_per_s"] for r in results)
                 for e in range(EPOCHS)]  # fmt: skip
        workers = [[r["epochs"][e]["workers"] for r in results] for e in range(EPOCHS)]
        cpu = statistics.median(r["cpu_s"] for r in results)
        table[name] = {"items_per_s": rates, "workers": workers, "cpu_s": cpu}
        print(f"  {name:>9}  samples/s per epoch {[round(x) for x in rates]}, workers "
              f"{workers}, CPU {cpu:.1f} s")  # fmt: skip
    return {"table": table, "runs": got}


def io_part(reps: int, seconds: float) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for ms in LATENCIES_MS:
        cases = {
            name: {"part": "io", "latency_ms": ms, "options": opts, "seconds": seconds}
            for name, opts in IO_SETTINGS.items()
        }
        got = runs(cases, reps)
        table = {name: medians(r, ("whole", "steady")) for name, r in got.items()}
        best = max((n for n in table if n != "auto"), key=lambda n: table[n]["steady"])
        auto, top = table["auto"], table[best]
        ratio = {k: auto[k] / top[k] for k in ("whole", "steady")}
        held = max(r["held_bytes"] for r in got["auto"])
        summary[ms] = {"table": table, "best_fixed": best, "auto_over_best": ratio,
                       "auto_held_bytes_max": held, "runs": got}  # fmt: skip
        print(f"\nio {ms} ms: samples/s, medians of {reps} (whole run / last half)")
        for name, row in table.items():
            print(f"  {name:>8}  {row['whole']:9,.0f}  {row['steady']:9,.0f}")
        where = [(r["fetch_limit"], r["num_workers"], r["prefetch"]) for r in got["auto"]]
        print(f"  auto / best fixed ({best}): {ratio['whole']:.2f} whole, {ratio['steady']:.2f} "
              f"last half; most held {held / 2**20:.1f} MiB of a 1024 MiB budget; settled "
              f"(fetch limit, workers, prefetch) {where}")  # fmt: skip
    return summary


def defaults_part(reps: int, knobs: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    items = max(w.items for w in WORKLOADS.values() if w.name == "http")
    with http_server(items) as server:
        for workload, spec in WORKLOADS.items():
            setting = 64 if spec.latency_bound else 2
            base = {
                k: getattr(v, "__name__", v) for k, v in asyncloader_options(spec, setting).items()
            }
            cases: dict[str, dict[str, Any]] = {}
            for knob in knobs:
                for value in KNOBS[knob]:
                    cases[f"{knob}={value}"] = {
                        "part": "defaults",
                        "workload": workload,
                        "setting": setting,
                        "options": {knob: value},
                        "port": server.port,
                    }
            got = runs(cases, reps)
            table = {name: medians(r, ("items_per_s",)) for name, r in got.items()}
            ratios = {
                knob: table[f"{knob}={auto}"]["items_per_s"]
                / table[f"{knob}={default}"]["items_per_s"]
                for knob, (default, auto) in KNOBS.items()
                if knob in knobs
            }
            summary[workload] = {"options": base, "table": table, "auto_over_default": ratios,
                                 "runs": got}  # fmt: skip
            print(f"\n{workload} ({base}): items/s, medians of {reps}")
            for name, row in table.items():
                print(f"  {name:>20}  {row['items_per_s']:9,.0f}")
            print("  auto / default: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    return summary


def nofile_part(reps: int) -> dict[str, Any]:
    """The http workload at ``io_concurrency`` 64 and "auto" in clients whose soft open-files
    limit is ``NOFILE`` (the server keeps this process's): "auto" must stay within it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with http_server(WORKLOADS["http"].items) as server:
        cases = {
            f"io_concurrency={value}": {
                "part": "defaults",
                "workload": "http",
                "setting": 64,
                "options": {"io_concurrency": value},
                "port": server.port,
            }
            for value in KNOBS["io_concurrency"]
        }
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(NOFILE, hard), hard))  # children inherit
        try:
            got = runs(cases, reps)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    table = {name: medians(r, ("items_per_s",)) for name, r in got.items()}
    print(f"\nhttp at a soft open-files limit of {NOFILE}: items/s, medians of {reps}")
    for name, rs in got.items():
        limits = sorted(r["fetch_limit"] for r in rs)
        print(f"  {name:>20}  {table[name]['items_per_s']:9,.0f}  (fetch limit {limits})")
    return {"nofile": NOFILE, "table": table, "runs": got}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", nargs="+", default=["cpu", "io", "lumpy", "epochs", "defaults"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--knobs", nargs="+", default=list(KNOBS), help="for --part defaults")
    summaries.add_save_argument(parser, "autosize")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    settings: dict[str, Any] = {"reps": args.reps, "seconds": args.seconds}
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "cpu": lambda: cpu_part(args.reps),
        "io": lambda: io_part(args.reps, args.seconds),
        "lumpy": lambda: lumpy_part(args.reps),
        "epochs": lambda: epochs_part(args.reps),
        "defaults": lambda: defaults_part(args.reps, args.knobs),
        "nofile": lambda: nofile_part(args.reps),
    }
    for name, part in parts.items():
        if name in args.part:
            summary = part()
            if args.save:
                summaries.save(f"{args.save}/{name}", {**settings, **summary})


if __name__ == "__main__":
    main()
