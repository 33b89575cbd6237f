"""The committed summary of every run: ``benchmarks/results/summary.json``.

The side-by-side benchmark (:mod:`benchmarks.bench`) writes its medians there; each probe run
with ``--save`` records its own summary in the same file, under ``"probes"`` and a section
named after the probe (and what varied), with the command that made it. A save replaces its
section only, and keeps medians and tables, never each run's figures (``runs``), which stay in
the probe's output. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"
#: Keys that hold each run's figures: left out of what is saved.
PER_RUN = frozenset({"runs", "alone_runs"})


def add_save_argument(parser: argparse.ArgumentParser, section: str) -> None:
    """``--save [SECTION]``: record the summary under ``SECTION`` (``section`` by default)."""
    parser.add_argument(
        "--save",
        nargs="?",
        const=section,
        metavar="SECTION",
        help=f"record the summary in {SUMMARY.relative_to(SUMMARY.parents[2])} "
        f"under probes/SECTION (default: {section})",
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
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
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


def probes(path: Path = SUMMARY) -> dict[str, Any]:
    """The probes' sections recorded in ``path`` (none when it does not exist)."""
    return json.loads(path.read_text()).get("probes", {}) if path.exists() else {}


def write(data: dict[str, Any], path: Path = SUMMARY) -> None:
    """Writes ``data`` to ``path`` whole or not at all (through a ``.tmp`` file beside it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
