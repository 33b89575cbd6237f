"""How worker processes are started when the user names no start method.

DataLoader forks its workers. asyncloader forks too when that is as safe as DataLoader's fork
(:func:`fork_is_safe`: Linux, the main thread, no other Python thread, so no lock can be held
at fork time); otherwise it uses the fork server (Linux) or spawn, which start each worker as
a fresh process that re-imports the main script. A script that starts workers from top-level
code, without ``if __name__ == "__main__":``, would then run again in every worker, so
:func:`check_start` refuses it at once, naming the fix, instead of failing obscurely later.
The fork server is started ahead of the first epoch where it will be needed
(:func:`prestart`), so the first batch does not wait for its imports.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
import threading
from functools import lru_cache
from typing import Any

from asyncloader._compat import caller_frames, start_fork_server

_PRELOAD = ["__main__", "asyncloader._worker"]


def fork_is_safe() -> bool:
    """Forking now is as safe as DataLoader's own fork: Linux, from the main thread, and no
    other Python thread alive (a thread holding a lock at fork time can deadlock the child)."""
    return (
        sys.platform == "linux"
        and threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
    )


def default_mp_context() -> Any:
    """The start method used when workers cannot be forked safely (see :func:`fork_is_safe`).

    forkserver on Linux: the fork server preloads asyncloader (and so torch) and the main module
    once, so each worker starts as a fork of an already-initialised, single-threaded process.
    spawn elsewhere.
    """
    if sys.platform == "linux":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def prestart(num_workers: int, mp_context: Any) -> None:
    """Starts the fork server now (without waiting for its imports) when this loader's first
    epoch would start its workers through it: they are asked for, no start method was named,
    and forking is not safe already (other threads run)."""
    if num_workers and mp_context is None and sys.platform == "linux" and not fork_is_safe():
        if unguarded_main_line() is None:
            default_mp_context()
            start_fork_server()


def check_start(ctx: Any) -> None:
    """Raises at once when workers started with ``ctx`` would re-run the main script.

    Raises:
        RuntimeError: ``ctx`` is not fork, and the loader is iterated from the main script's
            top-level code outside ``if __name__ == "__main__":``.
    """
    if ctx.get_start_method() == "fork":
        return
    line = unguarded_main_line()
    if line is None:
        return
    threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    why = f"other threads are running ({', '.join(threads)})" if threads else "it was asked for"
    raise RuntimeError(
        f"asyncloader: the workers would start with {ctx.get_start_method()!r} ({why}), which "
        f"re-runs the main script in every worker, and this script ({line}) starts them from "
        'top-level code. Put that code under `if __name__ == "__main__":` (as multiprocessing '
        'requires), or pass mp_context="fork" to fork the workers regardless of the threads.'
    )


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
