"""Engines: where a loader's batches are made. The :class:`~asyncloader._engines.engine.Engine`
seam an epoch talks to, and its local implementations: the pool of transforming workers, the
fetching workers and their channels, how worker processes start, and their lifetime across
epochs. :mod:`asyncloader._engines.ray` holds the Ray implementation behind
:class:`asyncloader.ray.RayEngine`.

Imports: :mod:`asyncloader._worker` (what the processes run), :mod:`asyncloader._tuning`,
:mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own
modules. ``ray`` is imported only under :mod:`asyncloader._engines.ray`.
"""

from __future__ import annotations

from asyncloader._engines.channels import Channels
from asyncloader._engines.engine import Engine, ExecutorEngine, LoopEngine, WorkerEngine
from asyncloader._engines.fetching_workers import worker_specs
from asyncloader._engines.lifetime import WorkerLease, Workers
from asyncloader._engines.requests import Requests, ToWorker, complete, worker_of

__all__ = [
    "Channels",
    "Engine",
    "ExecutorEngine",
    "LoopEngine",
    "Requests",
    "ToWorker",
    "WorkerEngine",
    "WorkerLease",
    "Workers",
    "complete",
    "worker_of",
    "worker_specs",
]
