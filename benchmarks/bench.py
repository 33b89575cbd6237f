"""The side-by-side benchmark: ``make bench`` (full) or ``make bench-quick``.

Runs every (loader, workload, setting) of :mod:`benchmarks.plan` in a fresh process
(:mod:`benchmarks.run_one`), loaders alternating, several repetitions, with the http workload's
server (:func:`benchmarks.workloads.http_server`) running beside them; samples the peak memory
of each run's whole process tree from here; writes one JSON per run, then the medians, the
Markdown table and the PNG plot (:mod:`benchmarks.report`). A run that delivers the wrong
samples, fails or hangs stops the benchmark with its error.

Where: the summary (``summary.json``, ``results.md``, ``results.png``) in ``results/``, where
git keeps the latest full run's, and the per-run JSON in ``results/runs/``, which git ignores;
a quick run writes both under ``results/quick/`` (ignored too). ``summary.json`` also holds the
probes' summaries (:mod:`benchmarks.side_by_side`), which a run keeps.

``python -m benchmarks.bench [--quick] [--reps N] [--only WORKLOAD ...] [--out DIR]``;
``--report-only`` rewrites the table, plot and docs/benchmarks.md's latest run from an existing
``summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks import plan, plot, report, side_by_side, workloads

RESULTS = Path(__file__).resolve().parent / "results"
RUN_TIMEOUT_S = 300
SAMPLE_EVERY_S = 0.01


def run_case(case: plan.Case, port: int | None) -> dict:
    """Runs one case in a fresh process; returns its result with the tree's peak RSS added."""
    args = [
        *case.argv(),
        *(["--port", port] if port is not None and case.workload == "http" else []),
    ]
    load = os.getloadavg()[0]
    result = side_by_side.in_fresh_process_sampled(
        "benchmarks.run_one", *args, every_s=SAMPLE_EVERY_S, timeout_s=RUN_TIMEOUT_S, rss=True
    )
    result.update(rep=case.rep, load1_before=load)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--reps", type=int, help="repetitions (default: 3 full, 1 quick)")
    parser.add_argument("--only", nargs="+", metavar="WORKLOAD", help="run only these")
    parser.add_argument("--out", type=Path, help="results folder (default: results/ or quick/)")
    parser.add_argument(
        "--no-readme", action="store_true", help="do not update docs/benchmarks.md's latest run"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the table, plot and latest run from the folder's summary.json; run nothing",
    )
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else plan.FULL_REPS)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    if args.report_only:
        summary = json.loads((out / "summary.json").read_text())
        summary["targets"] = report.targets(summary["rows"])
        publish(summary, out, readme=not (args.quick or args.no_readme or args.out))
        return
    cases = plan.cases(quick=args.quick, reps=reps, only=args.only)
    runs_dir = out / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)
    runs_dir.mkdir(parents=True)
    started = time.time()
    info = report.machine_info(quick=args.quick, reps=reps)
    http_items = [c.items for c in cases if c.workload == "http"]
    with contextlib.ExitStack() as stack:
        port = None
        if http_items:
            port = stack.enter_context(workloads.http_server(max(http_items))).port
        results = run_all(cases, port, runs_dir)
    info["elapsed_s"] = time.time() - started
    info["load1_after"] = os.getloadavg()[0]
    summary = report.summarize(results, info)
    if saved := side_by_side.saved(out / "summary.json"):  # the probes' sections stay
        summary["probes"] = saved
    side_by_side.write(summary, out / "summary.json")
    publish(summary, out, readme=not (args.quick or args.no_readme or args.out or args.only))


def progress_note(result: dict) -> str:
    """The bar's note on a finished run: its samples/s and the share of time the consumer
    waited for batches."""
    stall = result.get("stall_fraction")
    return f"{result['items_per_s']:,.0f} samples/s, stall " + (
        "-" if stall is None else f"{stall:.0%}"
    )


def run_all(cases: list[plan.Case], port: int | None, runs_dir: Path) -> list[dict]:
    """Runs ``cases`` one after another, each result written to ``runs_dir``, under a tqdm
    bar on stderr (stdout carries the results): the run under way, and the last one's
    samples/s and stall. Exits the program on a :class:`benchmarks.side_by_side.RunFailed`."""
    results: list[dict] = []
    last = ""
    # The bar is refreshed at every run; tqdm's monitor thread would outlive it, and a live
    # thread makes forking unsafe in the process that imported this (asyncloader then uses
    # the fork server).
    tqdm.monitor_interval = 0
    with tqdm(cases, unit="run", desc="benchmark", dynamic_ncols=True, file=sys.stderr) as bar:
        for case in bar:
            bar.set_postfix_str(f"{case}{last}")
            try:
                result = run_case(case, port)
            except side_by_side.RunFailed as exc:
                bar.close()
                sys.exit(f"benchmark stopped: {exc}")
            (runs_dir / f"{case.file_stem()}.json").write_text(json.dumps(result, indent=1))
            results.append(result)
            last = f" | last: {progress_note(result)}"
            bar.set_postfix_str(f"{case}{last}")
    return results


def publish(summary: dict, out: Path, readme: bool) -> None:
    """Writes the Markdown tables and the plot of ``summary``, and the latest run in
    docs/benchmarks.md (the targets table; the table of all runs is in ``results.md``)."""
    markdown = report.markdown(summary)
    (out / "results.md").write_text(markdown)
    plot.plot(summary, out / "results.png")
    if readme:
        page = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
        plot.update_latest(page, report.markdown(summary, all_runs=False), out)
    print(markdown)
    print(f"\nwritten: {out}/results.md, results.png, summary.json")


if __name__ == "__main__":
    main()
