"""The PNG plot of a benchmark summary, and the section of docs/benchmarks.md that shows the
latest one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.loaders import LOADERS
from benchmarks.report import best_row, fmt
from benchmarks.workloads import LATENCY_S, WORKLOADS

LATEST_BEGIN = "<!-- bench:begin (written by `make bench`) -->"
LATEST_END = "<!-- bench:end -->"

COLORS = {
    "DataLoader": "#d62728",
    "torchdata": "#1f77b4",
    "spdl": "#2ca02c",
    "asyncloader": "#9467bd",
}


def plot(summary: dict[str, Any], path: Path) -> None:
    """io/http: throughput vs requests in flight; cpu/big/overhead and first batch: bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, w in zip(axes[0][:2], ("io", "http"), strict=True):
        for lo in LOADERS:
            pts = sorted(
                (r["setting"], r["items_per_s"])
                for r in rows
                if r["workload"] == w and r["loader"] == lo
            )
            if pts:
                label = f"{lo} (x = workers)" if lo == "DataLoader" else lo
                ax.plot(*zip(*pts, strict=True), "o-", color=COLORS[lo], label=label)
        if w == "io":
            xs = [2, 1024]
            ax.plot(xs, [x / LATENCY_S for x in xs], ":", color="gray", label="limit n / 20 ms")
        ax.set(
            xscale="log",
            yscale="log",
            title=f"{w}: items/s vs requests in flight",
            xlabel="io_concurrency (DataLoader: num_workers)",
            ylabel="items/s",
        )
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    panels = [(axes[0][2], "cpu"), (axes[1][0], "big"), (axes[1][1], "overhead")]
    for ax, w in panels:
        found = [(lo, best_row(rows, w, lo, 2)) for lo in LOADERS]
        found = [(lo, r) for lo, r in found if r is not None]
        names = [lo for lo, _ in found]
        ax.bar(
            names,
            [r["items_per_s"] for _, r in found],
            color=[COLORS[lo] for lo in names],
            label="epoch",
        )
        ax.scatter(
            names,
            [r["steady_items_per_s"] or 0 for _, r in found],
            marker="_",
            s=600,
            color="black",
            label="steady (after 1st batch)",
            zorder=3,
        )
        ax.set(title=f"{w}: items/s, 2 workers", ylabel="items/s")
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
    ax = axes[1][2]
    names = list(WORKLOADS)
    width = 0.2
    for i, lo in enumerate(LOADERS):
        vals = []
        for w in names:
            cand = [r for r in rows if r["workload"] == w and r["loader"] == lo]
            setting = 64 if WORKLOADS[w].latency_bound and lo != "DataLoader" else None
            chosen = [r for r in cand if setting is None or r["setting"] == setting] or cand
            vals.append(min(r["ttfb_s"] for r in chosen) if chosen else 0)
        ax.bar(
            [j + (i - 1.5) * width for j in range(len(names))],
            vals,
            width,
            color=COLORS[lo],
            label=lo,
        )
    ax.set_xticks(range(len(names)), names)
    ax.set(
        yscale="log", title="time to first batch (io/http at 64; DataLoader best)", ylabel="seconds"
    )
    ax.legend(fontsize=8)
    m = summary["machine"]
    fig.suptitle(
        f"asyncloader vs DataLoader, torchdata.nodes, spdl: {m['cores']} cores, "
        f"{m['date']}, load {fmt(m.get('load1_median'), 1)}, medians of {m['reps']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def update_latest(page: Path, table: str, results: Path) -> None:
    """Replaces what ``page`` holds between the markers with ``table``, a link to the table of
    all runs and the plot (both in ``results``, linked relative to ``page``)."""
    text = page.read_text()
    if LATEST_BEGIN not in text or LATEST_END not in text:
        return
    head, rest = text.split(LATEST_BEGIN, 1)
    _, tail = rest.split(LATEST_END, 1)
    link = Path(os.path.relpath(results, page.parent)).as_posix()
    body = (
        f"{LATEST_BEGIN}\n{table}\nAll runs: [benchmarks/results/results.md]"
        f"({link}/results.md).\n\n![benchmark plot]({link}/results.png)\n"
    )
    page.write_text(head + body + LATEST_END + tail)
