"""Turns the runs' JSON into medians, the targets, a Markdown table and a PNG plot."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from collections import defaultdict
from importlib import metadata
from typing import Any

from benchmarks import side_by_side
from benchmarks.loaders import LOADERS
from benchmarks.workloads import LATENCY_S, WORKLOADS

METRICS = (
    "items_per_s",
    "steady_items_per_s",
    "ttfb_s",
    "cpu_s",
    "cpu_ms_per_item",
    "peak_rss_mb",
    "stall_fraction",
)
COMMAND = "make bench"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def machine_info(quick: bool, reps: int) -> dict[str, Any]:
    """Where and when the numbers come from."""
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "-"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("torch", "torchdata", "spdl", "numpy", "uvloop")},
        "commit": commit,
        "mode": "quick" if quick else "full",
        "reps": reps,
        "load1_before": os.getloadavg()[0],
    }


def summarize(results: list[dict], info: dict[str, Any]) -> dict[str, Any]:
    """Medians per (workload, loader, setting), and the targets evaluated on them."""
    groups: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for r in results:
        groups[(r["workload"], r["loader"], r["setting"])].append(r)
    rows, medians = [], side_by_side.medians(groups, METRICS)
    for (workload, loader, setting), runs in groups.items():
        row = {
            "workload": workload,
            "loader": loader,
            "setting": setting,
            "setting_name": runs[0]["setting_name"],
            "items": runs[0]["items"],
            "runs": len(runs),
        }
        rows.append(row | dict.fromkeys(METRICS) | medians[workload, loader, setting])
    order = {w: i for i, w in enumerate(WORKLOADS)}
    rows.sort(key=lambda r: (order[r["workload"]], LOADERS.index(r["loader"]), r["setting"]))
    for row in rows:
        others = [
            o["items_per_s"]
            for o in rows
            if o["workload"] == row["workload"] and o["loader"] != row["loader"]
        ]
        row["vs_best_other"] = row["items_per_s"] / max(others) if others else None
    loads = [r["load1_before"] for r in results]
    info = {**info, "load1_median": statistics.median(loads) if loads else None}
    info["load1_max"] = max(loads) if loads else None
    return {"machine": info, "rows": rows, "targets": targets(rows)}


def best_row(
    rows: list[dict], workload: str, loader: str, setting: int | None = None
) -> dict | None:
    """The row, or for ``setting=None`` the loader's fastest setting on the workload."""
    found = [
        r
        for r in rows
        if r["workload"] == workload
        and r["loader"] == loader
        and (setting is None or r["setting"] == setting)
    ]
    return max(found, key=lambda r: r["items_per_s"]) if found else None


def _ratio(ours: dict | None, other: dict | None, key: str = "items_per_s") -> float | None:
    if ours is None or other is None or not other.get(key) or ours.get(key) is None:
        return None
    return ours[key] / other[key]


def targets(rows: list[dict]) -> list[dict[str, Any]]:
    """The targets: ``value`` (epoch items/s) and ``steady`` (after the first batch)."""
    out: list[dict[str, Any]] = []

    def add(name, need, op, value, steady=None, against="-"):
        met = None if value is None else (value >= need if op == ">=" else value <= need)
        out.append(
            dict(
                name=name,
                need=f"{op} {need:g}",
                value=value,
                steady=steady,
                against=against,
                met=met,
            )
        )

    def al(workload: str, setting: int) -> dict | None:
        return best_row(rows, workload, "asyncloader", setting)

    io64, io1024 = al("io", 64), al("io", 1024)
    limit = {"items_per_s": 64 / LATENCY_S, "steady_items_per_s": 64 / LATENCY_S}
    add(
        "io@64 / limit 3200/s",
        0.95,
        ">=",
        _ratio(io64, limit),
        _ratio(io64, limit, "steady_items_per_s"),
        "64 / 20 ms",
    )
    for s, need in ((64, 1.0), (256, 1.3)):
        td, ours = best_row(rows, "io", "torchdata", s), al("io", s)
        add(
            f"io@{s} / torchdata({s} threads)",
            need,
            ">=",
            _ratio(ours, td),
            _ratio(ours, td, "steady_items_per_s"),
            f"torchdata({s})",
        )
    add(
        "io@1024 items/s",
        25000,
        ">=",
        io1024 and io1024["items_per_s"],
        io1024 and io1024["steady_items_per_s"],
    )
    add("io@1024 peak MB", 400, "<=", io1024 and io1024["peak_rss_mb"])
    http = al("http", 64)
    rivals = [
        best_row(rows, "http", "torchdata", 64),
        best_row(rows, "http", "spdl", 64),
        best_row(rows, "http", "DataLoader"),
    ]
    rivals = [r for r in rivals if r is not None]
    best = max(rivals, key=lambda r: r["items_per_s"]) if rivals else None
    who = f"{best['loader']}({best['setting']})" if best else "-"
    add(
        "http@64 / best other",
        1.1,
        ">=",
        _ratio(http, best),
        _ratio(http, best, "steady_items_per_s"),
        who,
    )
    add(
        "http@64 CPU ms/sample / best other's",
        1.0,
        "<=",
        _ratio(http, best, "cpu_ms_per_item"),
        None,
        who,
    )
    for w in ("cpu", "big", "overhead"):
        dl = best_row(rows, w, "DataLoader", 2)
        add(
            f"{w} / DataLoader(2)",
            1.0,
            ">=",
            _ratio(al(w, 2), dl),
            _ratio(al(w, 2), dl, "steady_items_per_s"),
            "DataLoader(2)",
        )
    sp = best_row(rows, "overhead", "spdl", 2)
    add(
        "overhead / spdl",
        5.0,
        ">=",
        _ratio(al("overhead", 2), sp),
        _ratio(al("overhead", 2), sp, "steady_items_per_s"),
        "spdl(2)",
    )
    dl_ttfb = [r for r in rows if r["workload"] == "io" and r["loader"] == "DataLoader"]
    fastest = min(dl_ttfb, key=lambda r: r["ttfb_s"]) if dl_ttfb else None
    add(
        "io@64 TTFB / DataLoader's",
        1.0,
        "<=",
        _ratio(io64, fastest, "ttfb_s"),
        None,
        f"DataLoader({fastest['setting']})" if fastest else "-",
    )
    add("io@64 TTFB s", 0.1, "<=", io64 and io64["ttfb_s"])
    return out


def fmt(x: Any, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def markdown(summary: dict[str, Any], all_runs: bool = True) -> str:
    """The targets and (``all_runs``) the full table of medians, with where and when they were
    measured."""
    m = summary["machine"]
    v = m["versions"]
    lines = [
        f"Measured {m['date']} on {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, "
        f"Python {m['python']}, torch {v['torch']}, torchdata {v['torchdata']}, "
        f"spdl {v['spdl']}; asyncloader at {m['commit']}. {m['mode']} run, medians of "
        f"{m['reps']} fresh-process runs each; `{COMMAND}` reproduces it. The machine is shared "
        f"with other work: 1-minute load average {fmt(m.get('load1_before'), 1)} when the "
        f"benchmark started, {fmt(m.get('load1_median'), 1)} (median; max "
        f"{fmt(m.get('load1_max'), 1)}) before its runs, which counts the benchmark's own runs "
        "too; so compare ratios within this table rather than absolute numbers across machines.",
        "",
        "**Targets**. *value* uses items/s over the whole epoch, from building the "
        "loader to its last batch (a fresh process: worker start-up included); *steady* uses "
        "items/s after the first batch.",
        "",
        "| target | needed | value | steady | against | met |",
        "|---|---|---|---|---|---|",
    ]
    for t in summary["targets"]:
        met = {True: "met", False: "**missed**", None: "-"}[t["met"]]
        digits = 0 if t["value"] is not None and t["value"] > 100 else 2
        lines.append(
            f"| {t['name']} | {t['need']} | {fmt(t['value'], digits)} | "
            f"{fmt(t['steady'], digits)} | {t['against']} | {met} |"
        )
    if not all_runs:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "**All runs** (medians). *setting* is io_concurrency (threads for torchdata, stage "
        "concurrency for spdl) on io/http, else num_workers; DataLoader's is always "
        "num_workers. CPU s: the whole process tree; peak MB: RSS summed over the tree, sampled "
        "every 10 ms. *vs best* divides items/s by the best other loader's on that workload.",
        "",
        "| workload | loader | setting | items | items/s | steady items/s | first batch s "
        "| CPU s | CPU ms/item | peak MB | vs best |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        lines.append(
            f"| {r['workload']} | {r['loader']} | {r['setting']} | {r['items']} | "
            f"{fmt(r['items_per_s'])} | {fmt(r['steady_items_per_s'])} | "
            f"{fmt(r['ttfb_s'], 3)} | {fmt(r['cpu_s'], 2)} | {fmt(r['cpu_ms_per_item'], 3)} "
            f"| {fmt(r['peak_rss_mb'])} | {fmt(r['vs_best_other'], 2)} |"
        )
    return "\n".join(lines) + "\n"
