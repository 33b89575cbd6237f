"""Which asyncloader worker process the calling code runs in: :func:`get_worker_info`.

Set once by a worker's start-up (:mod:`asyncloader._worker.startup`) and read anywhere, sources
included, so it sits at the bottom of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Describes the worker process the calling code runs in.

    Attributes:
        id: The worker's id, ``0 <= id < num_workers``.
        num_workers: How many worker processes the loader started.
        seed: The seed this worker's ``torch``, ``random`` and ``numpy`` RNGs were given.
        dataset: This worker's copy of the dataset (``None`` when samples are fetched on the
            event loop and the worker only transforms and collates them).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Returns the :class:`WorkerInfo` inside an asyncloader worker process, ``None`` elsewhere."""
    return _info


def set_worker_info(info: WorkerInfo | None) -> None:
    """Records this process's worker identity (called by the worker's start-up only)."""
    global _info
    _info = info
