"""What the benchmark runs: every (loader, workload, setting), repeated, loaders alternating.

Settings, so that each loader is compared at what a user would really pick:

- io and http: ``io_concurrency`` 16, 64, 256, 1024 for torchdata.nodes (threads), SPDL (async
  stage concurrency) and asyncloader; ``num_workers`` 2, 8, 16 for DataLoader (one request in
  flight per worker).
- cpu, big, overhead: 2 worker processes for every loader (the machine has 2 cores).

Item counts are DESIGN.md's (2000/2000/2000/1280/40000), except, to fit the full run in about
20 minutes on 2 cores and to keep high-concurrency runs long enough to measure:

- io and http at ``io_concurrency >= 256``: ``8 x io_concurrency`` items (2048, 8192), so a run
  spans at least 8 round trips instead of 2;
- DataLoader with 2 workers on io and http: 640 items (about 6.5 s instead of 20 s);
- SPDL on overhead: 10000 items (its per-item process pool runs ~1,500/s here: 27 s for 40000).

Within a repetition the loaders take turns (the first loader rotates every repetition), so
load from elsewhere on the machine falls on all of them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.loaders import CPU_WORKERS, LOADERS
from benchmarks.workloads import WORKLOADS

FULL_REPS = 5
CONCURRENCY = (16, 64, 256, 1024)
DATALOADER_WORKERS = (2, 8, 16)
QUICK_CONCURRENCY = (64, 256)
QUICK_DATALOADER_WORKERS = (8,)
QUICK_SCALE = 4  # quick mode: item counts divided by this


@dataclass(frozen=True)
class Case:
    """One run: a loader on a workload at one setting, in repetition ``rep``."""

    loader: str
    workload: str
    setting: int
    items: int
    rep: int

    def argv(self) -> list[str]:
        return [self.loader, self.workload, str(self.setting), str(self.items)]

    def file_stem(self) -> str:
        return f"{self.workload}-{self.setting:04d}-{self.loader}-r{self.rep}"

    def __str__(self) -> str:
        return f"{self.workload} {self.loader}({self.setting}) r{self.rep}"


def settings(loader: str, workload: str, quick: bool) -> tuple[int, ...]:
    """The settings (io_concurrency or num_workers) ``loader`` runs ``workload`` at."""
    if not WORKLOADS[workload].latency_bound:
        return (CPU_WORKERS,)
    if loader == "DataLoader":
        return QUICK_DATALOADER_WORKERS if quick else DATALOADER_WORKERS
    return QUICK_CONCURRENCY if quick else CONCURRENCY


def items(loader: str, workload: str, setting: int, quick: bool) -> int:
    """Samples in one run (see the module docstring for where they differ from DESIGN.md)."""
    w = WORKLOADS[workload]
    n = w.items
    if w.latency_bound and loader != "DataLoader":
        n = max(n, 8 * setting)
    if w.latency_bound and loader == "DataLoader" and setting <= 2:
        n = 640
    if workload == "overhead" and loader == "spdl":
        n = 10_000
    if quick:
        n = max(n // QUICK_SCALE, 4 * w.batch)
    return n


def cases(quick: bool, reps: int, only: list[str] | None = None) -> list[Case]:
    """All runs, in the order they run: repetition, workload, then loaders taking turns."""
    out = []
    names = [w for w in WORKLOADS if not only or w in only]
    for rep in range(reps):
        order = LOADERS[rep % len(LOADERS) :] + LOADERS[: rep % len(LOADERS)]
        for workload in names:
            per_loader = {lo: list(settings(lo, workload, quick)) for lo in order}
            for i in range(max(len(s) for s in per_loader.values())):
                for lo in order:
                    if i < len(per_loader[lo]):
                        s = per_loader[lo][i]
                        out.append(Case(lo, workload, s, items(lo, workload, s, quick), rep))
    return out
