"""Rules of the package's layout that keep it maintainable, checked on its source."""

import ast
import dataclasses
from pathlib import Path

import pytest

import asyncloader
from asyncloader._config.options import Options
from tests.helpers import SyncSource
from tests.helpers.parsing import parse

PACKAGE = Path(asyncloader.__file__).parent
COMPAT = PACKAGE / "_base" / "compat.py"
FOREIGN = ("torch", "multiprocessing", "concurrent")


def _private_uses(path: Path) -> list[str]:
    """Underscored names of torch, multiprocessing or concurrent.futures used in ``path``:
    private module imports, and ``getattr(x, "_name")`` reads."""
    found = []
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            if parts[0] in FOREIGN and any(p.startswith("_") for p in parts[1:] + names):
                found.append(f"from {node.module} import {', '.join(names)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
        ):
            found.append(f"getattr(..., {node.args[1].value!r})")
    return found


def test_private_apis_are_used_only_in_the_compat_module():
    """Every private API of torch, multiprocessing and concurrent.futures lives in _compat."""
    offenders = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != COMPAT and (uses := _private_uses(path))
    }
    assert offenders == {}
    assert _private_uses(COMPAT), "the checker must see the compat module's own uses"


def test_options_are_frozen_after_the_constructor():
    """Options are built and validated once; nothing downstream can change them."""
    options = Options(dataset=SyncSource(10), batch_size=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 8  # type: ignore[misc]
    assert options.batch_sampler.batch_size == 4
