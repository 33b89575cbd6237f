"""Every ``asyncloader.`` dotted path named in docs/, the README and the package's docstrings
names something that exists, so that moving a module cannot leave a stale reference behind."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import asyncloader

PACKAGE = Path(asyncloader.__file__).parent
ROOT = PACKAGE.parent
DOTTED = re.compile(r"\basyncloader(?:\.[A-Za-z_]\w*)+")


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = [
        tree,
        *(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ),
    ]
    found = [ast.get_docstring(n, clean=False) for n in nodes]
    # attribute docstrings: a string statement right after an assignment
    found += [
        n.value.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
    ]
    return [d for d in found if d]


def named_paths() -> dict[str, set[str]]:
    """Dotted path -> the files that name it."""
    texts = {p: p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]}
    texts |= {p: "\n".join(_docstrings(p)) for p in PACKAGE.rglob("*.py")}
    paths: dict[str, set[str]] = {}
    for path, text in texts.items():
        for dotted in DOTTED.findall(text):
            paths.setdefault(dotted, set()).add(str(path.relative_to(ROOT)))
    return paths


def _is_module(dotted: str) -> bool:
    """``dotted`` is a module or package of this checkout (not one an editable install of
    another checkout would find)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def resolves(dotted: str) -> bool:
    """``dotted`` is a module, or an attribute path inside the longest module it starts with."""
    parts = dotted.split(".")
    i = max(i for i in range(1, len(parts) + 1) if _is_module(".".join(parts[:i])))
    obj = importlib.import_module(".".join(parts[:i]))
    for name in parts[i:]:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def test_the_check_sees_stale_paths():
    """A path that names nothing is caught; module, class and attribute paths resolve."""
    assert resolves("asyncloader._worker.loop.WorkerCore.next_stream")
    assert resolves("asyncloader.sources")
    assert not resolves("asyncloader._worker_loop.WorkerCore")
    assert not resolves("asyncloader._base.kinds.NoSuchThing")


def test_every_dotted_path_in_docs_and_docstrings_exists():
    """Docs, README and docstrings name only modules and attributes that exist."""
    pytest.importorskip("ray")
    missing = {p: sorted(files) for p, files in named_paths().items() if not resolves(p)}
    assert missing == {}
