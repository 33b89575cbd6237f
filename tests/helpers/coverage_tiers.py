"""Line coverage of ``asyncloader/`` per test tier and in total, from the data files that
``make coverage`` writes (one per tier), and the lines that only the stress tier covers.

    python -m tests.helpers.coverage_tiers DIR [--before DATAFILE]

``DIR`` holds one coverage data file per tier, named after it (``unit``, ``integration``,
``system``, ``stress``). With ``--before``, the lines that data file covers and no tier covers
now are listed too: what a change of the suite stopped testing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coverage import Coverage, CoverageData

TIERS = ("unit", "integration", "system", "stress")


def covered(path: Path) -> dict[str, set[int]]:
    """The lines each measured file of ``asyncloader`` has covered, by path from the package."""
    data = CoverageData(basename=str(path))
    data.read()
    out = {}
    for name in data.measured_files():
        if "/asyncloader/" in name:
            out[name[name.rindex("/asyncloader/") + 1 :]] = set(data.lines(name) or ())
    return out


def statements() -> dict[str, set[int]]:
    """Every executable line of the package, by path from the package's parent."""
    import asyncloader

    root = Path(asyncloader.__file__).parent
    cov = Coverage(data_file=None)
    out = {}
    for path in sorted(root.rglob("*.py")):
        _, lines, _, _ = cov.analysis(str(path))
        out[str(path.relative_to(root.parent))] = set(lines)
    return out


def ranges(lines: set[int]) -> str:
    """``{3, 4, 5, 9}`` as ``"3-5, 9"``."""
    out: list[str] = []
    for line in sorted(lines):
        if out and int(out[-1].split("-")[-1]) == line - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{line}"
        else:
            out.append(str(line))
    return ", ".join(out)


def share(hits: dict[str, set[int]], every: dict[str, set[int]]) -> tuple[int, int]:
    total = sum(len(lines) for lines in every.values())
    return sum(len(hits.get(f, set()) & lines) for f, lines in every.items()), total


def stress_only(
    tiers: dict[str, dict[str, set[int]]], every: dict[str, set[int]]
) -> dict[str, set[int]]:
    """The lines the stress tier covers and no other tier does."""
    rest: dict[str, set[int]] = {}
    for tier, hits in tiers.items():
        for f, n in hits.items():
            if tier != "stress":
                rest.setdefault(f, set()).update(n)
    return {f: (n - rest.get(f, set())) & every.get(f, set()) for f, n in tiers["stress"].items()}


def report(folder: Path, before: Path | None) -> str:
    every = statements()
    tiers = {t: covered(folder / t) for t in TIERS if (folder / t).exists()}
    union: dict[str, set[int]] = {}
    rows = ["| tier | lines covered | of | share |", "|---|---:|---:|---:|"]
    for tier, hits in tiers.items():
        got, total = share(hits, every)
        rows.append(f"| {tier} | {got} | {total} | {got / total:.1%} |")
        for f, lines in hits.items():
            union.setdefault(f, set()).update(lines)
    got, total = share(union, every)
    rows.append(f"| all tiers | {got} | {total} | {got / total:.1%} |")
    lines = ["\n".join(rows)]
    if before is not None:
        old = covered(before)
        got, total = share(old, every)
        lines.append(f"\nbefore: {got} of {total} ({got / total:.1%})")
        lost = {f: (old.get(f, set()) - union.get(f, set())) & every[f] for f in every}
        lines.append("covered before, by no tier now:")
        lines += [f"  {f}: {ranges(n)}" for f, n in sorted(lost.items()) if n] or ["  none"]
    if "stress" in tiers:
        only = stress_only(tiers, every)
        lines.append(f"\ncovered only by the stress tier: {sum(map(len, only.values()))} lines")
        lines += [f"  {f}: {ranges(n)}" for f, n in sorted(only.items()) if n]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--before", type=Path)
    args = parser.parse_args(argv)
    print(report(args.folder, args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
