"""One workload through several loaders (or asyncloader from several source trees), side by
side: each run in a fresh process, loaders alternating, medians.

``python -m benchmarks.side_by_side WORKLOAD SETTING ITEMS LOADER... [--reps N] [--busy N]``

A loader is a name of :data:`benchmarks.loaders.BUILDERS`, optionally ``NAME@TREE`` to import
it from another checkout (``git worktree add /tmp/old a08f578``; run from this tree, whose
interpreter is used; the run imports the other tree's ``asyncloader`` and ``benchmarks``).
``--busy N`` keeps N busy-loop processes running beside the runs, to see
how the ranking holds on a loaded machine. Items/s over the epoch is what the benchmark's
targets use; the other columns are its other measurements. The http workload's server runs
for the whole comparison, as in the benchmark.

:func:`in_fresh_process` is how the probes (:mod:`benchmarks.probes`) run each measurement in
a process of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.workloads import http_server

ROOT = Path(__file__).resolve().parent.parent


def in_fresh_process(
    module: str, *args: object, cwd: Path | str = ROOT, timeout_s: float | None = None
) -> Any:
    """Runs ``python -m module args...`` in ``cwd``; returns its last line of output, as JSON.

    Raises ``subprocess.CalledProcessError`` (with its stderr) if it exits non-zero, and
    ``subprocess.TimeoutExpired`` (the process killed) past ``timeout_s``.
    """
    out = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        timeout=timeout_s,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def in_fresh_process_sampled(
    module: str, *args: object, every_s: float = 0.025, timeout_s: float = 300
) -> dict:
    """:func:`in_fresh_process`, with the memory of the process and all its descendants
    sampled from here every ``every_s``. Its result gains:

    - ``peak_pss_gb``: the peak PSS summed over the tree, and ``peak_main_pss_gb`` and
      ``peak_children_pss_gb`` at that peak;
    - ``peak_held_gb``: the peak of that sum without its shared memory (``Pss_Shmem``) plus
      the machine's shared memory in use (``Shmem`` of ``/proc/meminfo``) above its level at
      the start. PSS counts a page of shared memory only where a process has touched it
      through its mapping, so a batch segment made by one process and received but not yet
      read by another counts nowhere; this counts it (and any other process's shared
      memory made meanwhile: measure on a quiet machine).

    Reading a process's smaps takes its memory map's lock, which its ``fork()`` and page
    faults then wait for: time a run left alone, and take the memory from a sampled one.
    """
    cmd = [sys.executable, "-m", module, *map(str, args)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=ROOT)
        try:
            peaks = _sample_tree(proc, every_s, time.monotonic() + timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{err.read()[-4000:]}")
    result = json.loads(lines[-1])
    result.update({key: value / 2**30 for key, value in peaks.items()})
    return result


def _kib(text: str, field: str) -> int:
    """Bytes of ``field`` in a ``/proc`` file's ``Field:  N kB`` lines (0 where absent)."""
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _shmem() -> int:
    return _kib(Path("/proc/meminfo").read_text(), "Shmem")


def _sample_tree(proc: subprocess.Popen, every_s: float, deadline: float) -> dict[str, int]:
    """Peaks in bytes (see :func:`in_fresh_process_sampled`) of ``proc``'s tree until it
    exits; raises past ``deadline``. The list of descendants is refreshed every 0.1 s."""
    root = psutil.Process(proc.pid)
    procs, refreshed, shmem0 = [root], 0.0, _shmem()
    peaks = dict.fromkeys(
        ("peak_pss_gb", "peak_main_pss_gb", "peak_children_pss_gb", "peak_held_gb"), 0
    )
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"{proc.args} ran past its deadline")
        if now - refreshed >= 0.1:
            with contextlib.suppress(psutil.Error):
                procs = [root, *root.children(recursive=True)]
            refreshed = now
        main = rest = shared = 0
        for p in procs:
            with contextlib.suppress(OSError):
                rollup = Path(f"/proc/{p.pid}/smaps_rollup").read_text()
                pss = _kib(rollup, "Pss")
                shared += _kib(rollup, "Pss_Shmem")
                if p.pid == root.pid:
                    main = pss
                else:
                    rest += pss
        if main + rest > peaks["peak_pss_gb"]:
            peaks.update(peak_pss_gb=main + rest, peak_main_pss_gb=main, peak_children_pss_gb=rest)
        held = main + rest - shared + max(0, _shmem() - shmem0)
        peaks["peak_held_gb"] = max(peaks["peak_held_gb"], held)
        time.sleep(every_s)
    return peaks


def run(loader: str, workload: str, setting: int, items: int, port: int | None = None) -> dict:
    """One fresh-process run of ``benchmarks.run_one``, in ``loader``'s tree; ``port`` is the
    http workload's server's."""
    name, _, tree = loader.partition("@")
    args: list[object] = [name, workload, setting, items]
    if port is not None:
        args += ["--port", port]
    return in_fresh_process("benchmarks.run_one", *args, cwd=tree or ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("setting", type=int)
    parser.add_argument("items", type=int)
    parser.add_argument("loaders", nargs="+")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: dict[str, list[dict]] = {loader: [] for loader in args.loaders}
    try:
        with contextlib.ExitStack() as stack:
            port = None
            if args.workload == "http":
                port = stack.enter_context(http_server(args.items)).port
            for _ in range(args.reps):
                for loader in args.loaders:
                    runs[loader].append(run(loader, args.workload, args.setting, args.items, port))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"{args.workload} {args.setting} {args.items} items, {args.reps} runs each, medians")
    print("loader                          items/s   steady   first s   CPU s")
    for loader, results in runs.items():
        items, steady, first, cpu = (
            statistics.median(r[key] for r in results)
            for key in ("items_per_s", "steady_items_per_s", "ttfb_s", "cpu_s")
        )
        print(f"{loader:30s} {items:8.0f} {steady:8.0f} {first:9.3f} {cpu:7.2f}")
    print(*spread(runs), sep="\n")
    print("load average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))


def spread(runs: dict[str, list[dict]]) -> list[str]:
    """Each run's items/s, and each loader's per-round ratio to the last loader named (the
    rounds ran side by side), with its median and range."""
    lines = [
        f"  per run items/s, {name}: {[round(r['items_per_s']) for r in rs]}"
        for name, rs in runs.items()
    ]
    *others, anchor = runs
    for name in others:
        ratios = [
            mine["items_per_s"] / theirs["items_per_s"]
            for mine, theirs in zip(runs[name], runs[anchor], strict=True)
        ]
        lines.append(
            f"  {name} / {anchor} per round: median {statistics.median(ratios):.3f}x, "
            f"range {min(ratios):.3f}-{max(ratios):.3f} ({[round(x, 3) for x in ratios]})"
        )
    return lines


if __name__ == "__main__":
    main()
