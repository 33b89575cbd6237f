"""How worker processes are started.

As DataLoader: unless a start method is named, the workers start with ``multiprocessing``'s
default (``set_start_method`` included): fork on Linux before Python 3.14, forkserver from
3.14, spawn on macOS and Windows. Nothing asyncloader runs changes that choice: not its own
threads, not an earlier epoch or loader.

Fork: the workers are forked on the consumer's thread at ``iter()``, inside
:func:`~asyncloader._base.threads.loops_parked`, which parks every event loop running asyncloader
code between two of its callbacks, so no thread of asyncloader holds a lock at the fork (a
lock held then stays held in the child).
Its other threads at that moment wait on pipes, queues or selectors, or run your own code
(a sync ``__getitem__`` with ``num_workers=0``). Threads of your own (a logger, a monitor)
are yours to keep safe, exactly as under DataLoader, which forks the same way.

Start methods that pickle (spawn, forkserver) re-import the main script in every worker: a
script that starts workers from top-level code, without ``if __name__ == "__main__":``, would
run again there, so :func:`check_start` refuses it at once, naming the fix. It also refuses,
before any process starts, what the workers could not receive
(:mod:`asyncloader._engines.picklable`).
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from asyncloader._base import caller_frames, start_fork_server
from asyncloader._engines.picklable import check_picklable

_PRELOAD = ["__main__", "asyncloader._worker.startup"]


def default_mp_context() -> Any:
    """The start method DataLoader would use: ``multiprocessing``'s default (the one
    ``set_start_method`` set, else the platform's). When that is forkserver and the user set
    nothing, the fork server preloads asyncloader (and so torch) and the main module once."""
    method = multiprocessing.get_start_method(allow_none=True)
    ctx = multiprocessing.get_context(method or multiprocessing.get_all_start_methods()[0])
    if method is None and ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def forks(ctx: Any) -> bool:
    """Workers started with ``ctx`` are forked from the training process."""
    return bool(ctx.get_start_method() == "fork")


def prestart(num_workers: int, mp_context: Any) -> None:
    """Readies, when the loader is built, what its workers start from, so that its first
    ``iter()`` does not wait for it: for forked workers the imports they inherit
    (:func:`warm_for_fork`); the fork server (started, its imports not waited for) when
    they start through it."""
    if not num_workers:
        return
    ctx = mp_context or default_mp_context()
    if forks(ctx):
        warm_for_fork()
    elif (
        sys.platform == "linux"
        and ctx.get_start_method() == "forkserver"
        and unguarded_main_line() is None
    ):
        start_fork_server()


def warm_for_fork() -> None:
    """Imports here what every forked worker would otherwise import at its start, once per
    worker and per epoch: ``numpy.random`` (seeding; numpy loads it lazily), about 10-20 ms
    of each worker's start. A fork inherits it."""
    import numpy.random  # noqa: F401


def check_start(ctx: Any, sent: Mapping[str, Any]) -> None:
    """Raises at once, before any process starts, when workers started with ``ctx`` would
    re-run the main script or could not receive what they are sent.

    Args:
        sent: What every worker receives, by the loader argument's name (``dataset``,
            ``collate_fn``...).

    Raises:
        RuntimeError: ``ctx`` is not fork, and the loader is iterated from the main script's
            top-level code outside ``if __name__ == "__main__":``.
        TypeError: ``ctx`` is not fork, and one of ``sent`` cannot be pickled, or unpickled in
            a fresh process (see :func:`asyncloader._engines.picklable.check_picklable`).
    """
    if forks(ctx):
        return
    method = ctx.get_start_method()
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.isfile(main_file):
        raise RuntimeError(
            f"asyncloader: the workers start with {method!r}, which re-runs the main script "
            f"in every worker, and this one ({main_file}) is not a file (`python -`): run it "
            'from a file, or pass mp_context="fork" (Linux)'
        )
    line = unguarded_main_line()
    if line is not None:
        fork = ' or pass mp_context="fork" (Linux)' if sys.platform == "linux" else ""
        raise RuntimeError(
            f"asyncloader: the workers start with {method!r}, which re-runs the main script in "
            f"every worker, and this script ({line}) starts them from top-level code. Put "
            'that code under `if __name__ == "__main__":` (as multiprocessing requires)'
            f"{fork}."
        )
    check_picklable(sent, method)


def unguarded_main_line() -> str | None:
    """``"path:line"`` when the caller runs inside the main script's top-level code and not
    under an ``if __name__ == "__main__":`` block; ``None`` otherwise (or when there is no
    main script, as in a REPL or a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return None
    for frame in caller_frames():
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            guarded = _guarded_lines(path)
            if guarded is None or frame.f_lineno in guarded:
                return None
            return f"{path}:{frame.f_lineno}"
    return None


@lru_cache(maxsize=8)
def _guarded_lines(path: str) -> frozenset[int] | None:
    """Lines of ``path`` inside a top-level ``if __name__ == "__main__":`` (None: unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            end = node.end_lineno or node.lineno
            lines.update(range(node.lineno, end + 1))
    return frozenset(lines)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]
