"""Loads an upstream test file from $ASYNCLOADER_UPSTREAM as module
``tests.stress.compat.upstream.<stem>``, then swaps its ``DataLoader`` / ``StatefulDataLoader``
globals
for shim's (in memory only: the file is never modified or copied).

A meta-path finder rather than a one-off import, so that a process started with spawn or
forkserver, which unpickles ``tests.stress.compat.upstream.test_dataloader.<something>`` and so
imports
the module again, loads it the same way (the environment variables are inherited).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import multiprocessing
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "tests.stress.compat.upstream"
#: Beside the repository's own directory (never inside it).
DEFAULT_DIR = Path(__file__).resolve().parents[3] / "upstream"
#: the upstream files, by the name their tests get (see expected.py)
FILES = ("test_dataloader.py", "test_state_dict.py")


def upstream_dir() -> Path:
    return Path(os.environ.get("ASYNCLOADER_UPSTREAM", DEFAULT_DIR))


class _SwapLoader(importlib.machinery.SourceFileLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        # test_dataloader.py does __import__(basename of __file__) to find itself: that name
        # must be this module, not a second, unswapped copy found on sys.path.
        stem = self.name.rpartition(".")[2]
        sys.modules.setdefault(stem, module)
        super().exec_module(module)
        from tests.stress.compat.shim import SWAP

        for name, replacement in SWAP.items():
            if name in vars(module):
                setattr(module, name, replacement)
        if multiprocessing.parent_process() is not None:
            # A test's own child process (it exits after the test): swap the public name too.
            public_name_swapped().__enter__()


@contextlib.contextmanager
def public_name_swapped() -> Iterator[None]:
    """``torch.utils.data.DataLoader`` is the shim's ``DataLoader`` within."""
    import torch.utils.data

    from tests.stress.compat.shim import SWAP

    if "DataLoader" not in SWAP:
        yield
        return
    saved = torch.utils.data.DataLoader
    torch.utils.data.DataLoader = SWAP["DataLoader"]
    try:
        yield
    finally:
        torch.utils.data.DataLoader = saved


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == PACKAGE:
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = []
            return spec
        if not fullname.startswith(PACKAGE + "."):
            return None
        stem = fullname[len(PACKAGE) + 1 :]
        file = upstream_dir() / f"{stem}.py"
        if not file.is_file():
            return None
        return importlib.util.spec_from_file_location(
            fullname, file, loader=_SwapLoader(fullname, str(file))
        )


_FINDER = _Finder()


def install() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def load(filename: str) -> types.ModuleType:
    """The upstream module for ``filename`` (e.g. ``"test_dataloader.py"``), swapped."""
    install()
    return importlib.import_module(f"{PACKAGE}.{Path(filename).stem}")
