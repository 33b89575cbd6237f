"""What a test starts, so that each tier's conftest can hold its tests to what the tier allows:
``unit`` starts no process, ``integration`` only forked worker processes.

Counted in this process from the first import on: every fork (``os.register_at_fork``, which
multiprocessing's fork start method goes through), every ``multiprocessing`` process by its
start method (spawn and forkserver do not fork this process), and every ``subprocess.Popen``
(scripts, servers, asyncio's subprocesses).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_started: Counter[str] = Counter()


def _count_fork() -> None:
    _started["fork"] += 1


def _counting_start(start: Any) -> Any:
    def counted(self: multiprocessing.process.BaseProcess) -> None:
        method = getattr(self, "_start_method", None) or multiprocessing.get_start_method()
        _started[f"process ({method})"] += 1
        start(self)

    return counted


def _counting_popen(init: Any) -> Any:
    def counted(self: subprocess.Popen, args: Any, *rest: Any, **kw: Any) -> None:
        program = args if isinstance(args, str | bytes | os.PathLike) else next(iter(args), "")
        name = (os.path.basename(os.fsdecode(program)).split() or ["?"])[0]
        _started[f"subprocess {name}"] += 1
        init(self, args, *rest, **kw)

    return counted


os.register_at_fork(before=_count_fork)
multiprocessing.process.BaseProcess.start = _counting_start(  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start
)
subprocess.Popen.__init__ = _counting_popen(subprocess.Popen.__init__)  # type: ignore[method-assign]


@contextmanager
def counting_starts() -> Iterator[Counter[str]]:
    """Within the block, the processes started, by kind (``fork``, ``process (spawn)``,
    ``subprocess python``...); filled in when the block ends."""
    before = _started.copy()
    found: Counter[str] = Counter()
    try:
        yield found
    finally:
        found.update(_started - before)
