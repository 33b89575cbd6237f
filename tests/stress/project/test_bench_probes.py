"""Every probe and the harness's commands, run at toy size in fresh processes so that none of
them rots unnoticed; and the rule that no probe imports another probe or the tests. The toy
runs check that each ends cleanly and prints its table, never what it measured."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

ROOT = REPO
PROBES = ROOT / "benchmarks" / "probes"
#: Not a probe: the dataset of a retired one, which tests/system/engines/hygiene_scripts imports.
NOT_PROBES = {"__init__"}
#: Each probe's toy runs (arguments after ``python -m benchmarks.probes.NAME``), the modules
#: they need beyond the dev extra, and what their output must contain.
TOY: dict[str, list[tuple[list[str], list[str], str]]] = {
    "autotune": [
        (["--toy"], [], "auto / best fixed (64)"),
        (["--toy", "--epochs"], [], "1 of 1 ended"),
    ],
    "columnar": [(["--toy"], ["pyarrow", "zstandard"], "columns=['id']:")],
    "gc_handoff": [(["--toy"], ["pyarrow"], "rows made when taken")],
    "hf_datasets": [(["--toy"], ["datasets"], "AsyncLoader, 2 fetching")],
    "inmemory": [(["--toy"], [], "dicts | AsyncLoader forkserver")],
    "jpeg_shards": [(["--toy"], ["webdataset"], "| alone: ImageBatch uint8 |")],
    "trace_overhead": [(["--toy"], [], "overhead on")],
}
#: The harness at toy size: (module and arguments, modules it needs, expected output).
HARNESS: list[tuple[list[str], list[str], str]] = [
    (
        ["benchmarks.side_by_side", "overhead", "2", "500", "DataLoader", "asyncloader"],
        [],
        "DataLoader / asyncloader per round",
    ),
    (
        ["benchmarks.side_by_side", "http", "16", "200", "asyncloader", "DataLoader"],
        [],
        "asyncloader / DataLoader per round",
    ),
]


def _run(argv: list[str], needs: list[str], expected: str) -> None:
    for module in needs:
        pytest.importorskip(module)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert expected in out.stdout, out.stdout[-4000:]


def test_every_probe_has_a_toy_run():
    """A probe added without a toy run here fails, so the slow test below covers them all."""
    found = {p.stem for p in PROBES.glob("*.py")} - NOT_PROBES
    assert found == set(TOY)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").rglob("*.py")), ids=lambda p: p.stem)
def test_no_benchmark_imports_the_tests_nor_a_probe_another(path):
    """benchmarks/ never imports tests.*; a probe imports no other probe (itself by name, so
    that its workers can unpickle what it sends them, is allowed)."""
    imported = _imports(path)
    assert not {n for n in imported if n == "tests" or n.startswith("tests.")}
    if path.parent == PROBES:
        probes = {n.split(".")[2] for n in imported if n.startswith("benchmarks.probes.")}
        assert probes <= {path.stem}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("probe", "args", "needs", "expected"),
    [
        pytest.param(probe, *run, id=" ".join([probe, *run[0]]))
        for probe, runs in TOY.items()
        for run in runs
    ],
)
def test_probe_runs_at_toy_size(probe, args, needs, expected):
    """``python -m benchmarks.probes.PROBE --toy`` ends cleanly and prints its table."""
    _run([f"benchmarks.probes.{probe}", *args], needs, expected)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("argv", "needs", "expected"), HARNESS, ids=[" ".join(argv[1:3]) for argv, *_ in HARNESS]
)
def test_side_by_side_runs_at_toy_size(argv, needs, expected):
    """The harness's side-by-side command, one round of a few hundred items, with the http
    workload's server too."""
    _run([*argv, "--reps", "1"], needs, expected)


@pytest.mark.timeout(300)
def test_bench_quick_runs_one_workload(tmp_path):
    """``python -m benchmarks.bench --quick`` on the overhead workload, every loader, into a
    scratch folder (docs/benchmarks.md untouched); needs the bench extra."""
    for module in ("spdl", "matplotlib"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the bench extra)")
    argv = ["benchmarks.bench", "--quick", "--only", "overhead", "--out", str(tmp_path)]
    _run([*argv, "--no-readme"], [], "")
    assert (tmp_path / "summary.json").exists()
