"""Says once when a sync iterable source's own work takes much of the training process.

A sync iterable is pulled on one thread of the training process (``asyncloader-source``), so
whatever its ``__iter__``/``__next__`` does (decoding, a webdataset pipeline's ``map``) runs
there, on one core, however many workers there are. :class:`PullMeter` times each pull in CPU
seconds of that thread; once the epoch has run :data:`MIN_WALL_S` and those seconds are at least
:data:`SHARE` of its wall time, it warns, once per source object, with the share and the fix.
The cost is two ``time.thread_time()`` calls per batch.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from asyncloader.errors import SourceHeavyWarning

T = TypeVar("T")

#: Warn when pulling the source takes at least this share of the epoch's wall time in CPU...
SHARE = 0.5
#: ...measured over at least this many seconds of the epoch (short epochs say nothing).
MIN_WALL_S = 2.0

_warned: weakref.WeakSet[Any] = weakref.WeakSet()
_warned_ids: set[int] = set()  # sources that cannot be weakly referenced


def _first_time(source: Any) -> bool:
    try:
        if source in _warned:
            return False
        _warned.add(source)
    except TypeError:
        if id(source) in _warned_ids:
            return False
        _warned_ids.add(id(source))
    return True


class PullMeter:
    """Measures the CPU a sync source's pulls take against the epoch's wall time."""

    __slots__ = ("_cpu", "_done", "_source", "_start", "_workers")

    def __init__(self, source: Any, num_workers: int) -> None:
        self._source = source
        self._workers = num_workers
        self._start = time.perf_counter()
        self._cpu = 0.0
        self._done = False

    def timed(self, pull: Callable[[], T]) -> Callable[[], T]:
        """``pull``, timed (to be run on the thread that pulls the source)."""

        def run() -> T:
            before = time.thread_time()
            try:
                return pull()
            finally:
                self._cpu += time.thread_time() - before
                if not self._done:
                    self._check()

        return run

    def _check(self) -> None:
        wall = time.perf_counter() - self._start
        if wall < MIN_WALL_S or self._cpu < SHARE * wall:
            return
        self._done = True
        if not _first_time(self._source):
            return
        name = type(self._source).__qualname__
        workers = self._workers if self._workers > 0 else 2
        warnings.warn(
            f"asyncloader: producing the items of the iterable source {name} took "
            f"{self._cpu / wall:.0%} of the training process's time so far ({self._cpu:.1f} s "
            f"of CPU in {wall:.1f} s): its own __iter__/__next__ work runs in this process, "
            "on one thread, whatever num_workers is. Iterate it in the workers instead: "
            f"AsyncLoader(..., num_workers={workers}, fetch_in_workers=True), where each "
            "worker iterates its own copy as DataLoader's workers do (the source must split "
            "its items with torch.utils.data.get_worker_info(), as webdataset and asyncloader's "
            "sharded sources do), or move the per-item work into transform=.",
            SourceHeavyWarning,
            stacklevel=2,
        )
