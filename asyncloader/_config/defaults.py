"""Where the ``"auto"`` options start and how far they may go: read by the options when they
are completed, and by the tuners (:mod:`asyncloader._tuning`) that move them.
"""

from __future__ import annotations

import os

from asyncloader._base import available_cores

PREFETCH_START = 2  # the fixed default: a short epoch is never held tighter than it
PREFETCH_CAP = 16
CAP = 4096  # the highest io_concurrency "auto" reaches
DEFAULT_BUDGET = 1 << 30  # bytes of samples in flight (1 GiB) unless memory_budget says


def start_workers(loop_fed: bool) -> int:
    """The first epoch's workers: 0 when ``loop_fed`` (they would only collate what this
    process's loop fetched), else the usable cores, shared among this node's ranks."""
    if loop_fed:
        return 0
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    share = max(1, int(ranks)) if ranks.isdigit() else 1
    return max(1, (available_cores() or 1) // share)
