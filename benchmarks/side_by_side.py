"""Rounds, pairing, medians and spreads: how every benchmark here compares things; and the
harness's side-by-side command, one workload through several loaders.

The API, used by :mod:`benchmarks.bench` and every probe (:mod:`benchmarks.probes`):

- :func:`in_fresh_process` / :func:`in_fresh_process_sampled`: one measurement, a process of
  its own (the second samples the tree's memory);
- :func:`rounds`: every case once per round, in the same order, ``reps`` rounds, so the cases
  alternate and each round's cases ran back to back;
- :func:`medians`, :func:`paired` (each case's per-round ratio to an anchor case of the same
  round: lowest, median, highest) and :func:`spread` (those as text);
- :func:`save` / :func:`saved` / :func:`write`: the committed summary,
  ``benchmarks/results/summary.json``; a probe run with ``--save`` (:func:`add_save_argument`)
  records its summary under ``"probes"`` and a section named after it, with its command. A
  save replaces its section only and keeps medians and tables, never each run's figures
  (``runs``), which stay in the probe's output. See docs/benchmarks.md.

``python -m benchmarks.side_by_side WORKLOAD SETTING ITEMS LOADER... [--reps N] [--busy N]``

A loader is a name of :data:`benchmarks.loaders.BUILDERS`, optionally ``NAME@TREE`` to import
it from another checkout (``git worktree add /tmp/old a08f578``; run from this tree, whose
interpreter is used; the run imports the other tree's ``asyncloader`` and ``benchmarks``).
``--busy N`` keeps N busy-loop processes running beside the runs, to see
how the ranking holds on a loaded machine. Items/s over the epoch is what the benchmark's
targets use; the other columns are its other measurements. The http workload's server runs
for the whole comparison, as in the benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.workloads import http_server

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / "benchmarks" / "results" / "summary.json"
#: Keys that hold each run's figures: left out of what is saved.
PER_RUN = frozenset({"runs", "alone_runs"})


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


class RunFailed(RuntimeError):
    """A fresh-process run exited non-zero, ran past its deadline, or printed no result."""


def in_fresh_process_sampled(
    module: str, *args: object, every_s: float = 0.025, timeout_s: float = 300, rss: bool = False
) -> dict:
    """:func:`in_fresh_process`, with the memory of the process and all its descendants
    sampled from here every ``every_s`` (their list refreshed every 0.1 s). Its result gains:

    - ``peak_pss_gb``: the peak PSS summed over the tree, and ``peak_main_pss_gb`` and
      ``peak_children_pss_gb`` at that peak;
    - ``peak_held_gb``: the peak of that sum without its shared memory (``Pss_Shmem``) plus
      the machine's shared memory in use (``Shmem`` of ``/proc/meminfo``) above its level at
      the start. PSS counts a page of shared memory only where a process has touched it
      through its mapping, so a batch segment made by one process and received but not yet
      read by another counts nowhere; this counts it (and any other process's shared
      memory made meanwhile: measure on a quiet machine).

    Reading a process's smaps takes its memory map's lock, which its ``fork()`` and page
    faults then wait for: time a run left alone, and take the memory from a sampled one. With
    ``rss``, the result gains only ``peak_rss_mb`` instead, the peak of the tree's summed RSS
    (shared memory counted in every process that maps it), which takes no such lock: how
    :mod:`benchmarks.bench` samples the runs it times.

    Raises:
        RunFailed: It exited non-zero, ran past ``timeout_s`` or printed nothing.
    """
    cmd = [sys.executable, "-m", module, *map(str, args)]
    sample = _rss if rss else functools.partial(_pss, shmem0=_shmem())
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=ROOT)
        root, peaks, refreshed = psutil.Process(proc.pid), {}, 0.0
        procs, deadline = [root], time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if (now := time.monotonic()) > deadline:
                    raise RunFailed(f"{' '.join(cmd[1:])} ran past {timeout_s} s")
                if now - refreshed >= 0.1:
                    with contextlib.suppress(psutil.Error):
                        procs = [root, *root.children(recursive=True)]
                    refreshed = now
                sample(procs, peaks)
                time.sleep(every_s)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RunFailed(f"{cmd} failed ({proc.returncode}):\n{err.read()[-4000:]}")
    return {**json.loads(lines[-1]), **peaks}


def _kib(text: str, field: str) -> int:
    """Bytes of ``field`` in a ``/proc`` file's ``Field:  N kB`` lines (0 where absent)."""
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _shmem() -> int:
    return _kib(Path("/proc/meminfo").read_text(), "Shmem")


def _rss(procs: list[psutil.Process], peaks: dict[str, float]) -> None:
    """Raises ``peaks["peak_rss_mb"]`` to the tree's summed RSS now, where it is higher."""
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    peaks["peak_rss_mb"] = max(peaks.get("peak_rss_mb", 0.0), total / 2**20)


def _pss(procs: list[psutil.Process], peaks: dict[str, float], shmem0: int) -> None:
    """Raises ``peaks``' PSS figures (see :func:`in_fresh_process_sampled`) to the tree's now,
    where they are higher; ``procs[0]`` is the run's own process."""
    main = rest = shared = 0
    for p in procs:
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{p.pid}/smaps_rollup").read_text()
            pss = _kib(rollup, "Pss")
            shared += _kib(rollup, "Pss_Shmem")
            if p is procs[0]:
                main = pss
            else:
                rest += pss
    if (main + rest) / 2**30 >= peaks.get("peak_pss_gb", 0.0):
        peaks.update(
            peak_pss_gb=(main + rest) / 2**30,
            peak_main_pss_gb=main / 2**30,
            peak_children_pss_gb=rest / 2**30,
        )
    held = (main + rest - shared + max(0, _shmem() - shmem0)) / 2**30
    peaks["peak_held_gb"] = max(peaks.get("peak_held_gb", 0.0), held)


def rounds(
    cases: Sequence[str], reps: int, one: Callable[[str], Any], snake: bool = False
) -> dict[str, list]:
    """``{case: [one(case) of round 1, of round 2, ...]}``: ``reps`` rounds, each running every
    case once in the order given (``snake``: every other round in reverse, so no case always
    follows the same one), so the cases alternate and a round's runs are neighbours."""
    runs: dict[str, list] = {case: [] for case in cases}
    for rep in range(reps):
        for case in reversed(cases) if snake and rep % 2 else cases:
            runs[case].append(one(case))
    return runs


def medians(runs: dict[Any, list[dict]], keys: Iterable[str]) -> dict[Any, dict[str, float]]:
    """``{case: {key: median over its runs}}``; runs without ``key`` (or with ``None``) are left
    out of that key's median, and a key no run has is left out."""
    out: dict[Any, dict[str, float]] = {}
    for case, rs in runs.items():
        out[case] = {}
        for key in keys:
            values = [r[key] for r in rs if r is not None and r.get(key) is not None]
            if values:
                out[case][key] = statistics.median(values)
    return out


def paired(
    runs: dict[str, list[dict]], anchor: str, key: str = "items_per_s"
) -> dict[str, tuple[float, float, float]]:
    """Each other case's ratio of ``key`` to ``anchor``'s in the same round (the two ran back
    to back): ``{case: (lowest, median, highest)}`` over the rounds where both have it."""
    out = {}
    for case, rs in runs.items():
        ratios = [
            mine[key] / theirs[key]
            for mine, theirs in zip(rs, runs.get(anchor, []), strict=False)
            if mine and theirs and mine.get(key) and theirs.get(key)
        ]
        if case != anchor and ratios:
            out[case] = (min(ratios), statistics.median(ratios), max(ratios))
    return out


def spread(runs: dict[str, list[dict]], key: str = "items_per_s") -> list[str]:
    """Each run's ``key``, and each case's per-round ratio to the last case named, as text."""
    lines = [f"  per run {key}, {name}: {[round(r[key]) for r in rs]}" for name, rs in runs.items()]
    *_, anchor = runs
    for name, (low, mid, high) in paired(runs, anchor, key).items():
        lines.append(
            f"  {name} / {anchor} per round: median {mid:.3f}x, range {low:.3f}-{high:.3f}"
        )
    return lines


def add_save_argument(parser: argparse.ArgumentParser, section: str) -> None:
    """``--save [SECTION]``: record the summary under ``SECTION`` (``section`` by default)."""
    parser.add_argument(
        "--save",
        nargs="?",
        const=section,
        metavar="SECTION",
        help=f"record the summary in benchmarks/results/summary.json under probes/SECTION "
        f"(default: {section})",
    )


def without_runs(summary: Any) -> Any:
    """``summary`` without the figures of each run (a list or mapping under a key of
    :data:`PER_RUN`; a count of runs stays), at any depth."""
    if isinstance(summary, dict):
        return {
            k: without_runs(v)
            for k, v in summary.items()
            if not (k in PER_RUN and isinstance(v, (list, dict)))
        }
    if isinstance(summary, list):
        return [without_runs(v) for v in summary]
    return summary


def command() -> str:
    """The command line of this process, as ``python -m module args...``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"-m {spec.name}" if spec is not None else sys.argv[0]
    return " ".join(["python", program, *sys.argv[1:]])


def save(section: str, summary: dict[str, Any], path: Path = SUMMARY) -> None:
    """Records ``summary`` (without each run's figures) under ``probes/section`` of ``path``,
    with this process's command; the rest of the file stays as it is."""
    data = json.loads(path.read_text()) if path.exists() else {}
    probes = data.setdefault("probes", {})
    probes[section] = {"command": command(), **without_runs(summary)}
    data["probes"] = dict(sorted(probes.items()))
    write(data, path)


def saved(path: Path = SUMMARY) -> dict[str, Any]:
    """The probes' sections recorded in ``path`` (none when it does not exist)."""
    return json.loads(path.read_text()).get("probes", {}) if path.exists() else {}


def write(data: dict[str, Any], path: Path = SUMMARY) -> None:
    """Writes ``data`` to ``path`` whole or not at all (through a ``.tmp`` file beside it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


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
    try:
        with contextlib.ExitStack() as stack:
            port = None
            if args.workload == "http":
                port = stack.enter_context(http_server(args.items)).port
            runs = rounds(
                args.loaders,
                args.reps,
                lambda loader: run(loader, args.workload, args.setting, args.items, port),
            )
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"{args.workload} {args.setting} {args.items} items, {args.reps} runs each, medians")
    print("loader                          items/s   steady   first s   CPU s")
    keys = ("items_per_s", "steady_items_per_s", "ttfb_s", "cpu_s")
    for loader, m in medians(runs, keys).items():
        items, steady, first, cpu = (m[key] for key in keys)
        print(f"{loader:30s} {items:8.0f} {steady:8.0f} {first:9.3f} {cpu:7.2f}")
    print(*spread(runs), sep="\n")
    print("load average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
