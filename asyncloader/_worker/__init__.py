"""What runs inside a worker process: its start-up and identity, the orphan watchdog, the
allocator's treatment of batch memory, the plan a batch is made by (fetch, transform,
collate), the fetch on the worker's own event loop, the transport of finished batches, the
messages exchanged with the training process, and the fetching worker's loop.

Imports: :mod:`asyncloader._tuning` (the io limit's tuner runs here), :mod:`asyncloader._config`,
:mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own modules; never code of the
training process's side (checkpoints, engines, the pipeline), nor :mod:`asyncloader.sources`.
"""

from __future__ import annotations

from asyncloader._worker.allocator import empty_huge
from asyncloader._worker.buffers import Pooled, Returns, batch_tensor
from asyncloader._worker.collate import collate_small
from asyncloader._worker.fetch import Fetcher, fetch_then_run
from asyncloader._worker.getitems import BatchFetcher
from asyncloader._worker.loop import WorkerCore, serve, serve_on
from asyncloader._worker.plan import BatchPlan, run_batch, run_batch_traced
from asyncloader._worker.process_state import shares_batches
from asyncloader._worker.protocol import (
    LOST,
    STOP,
    SUPERSEDED,
    Ended,
    Keyed,
    NextOfStream,
    OpenStream,
    Request,
    RunBatch,
    StreamOpen,
    WorkerConfig,
    WorkerSpec,
    batch_of,
    read_answer,
)
from asyncloader._worker.startup import Running, init_failure, init_worker, setup_worker
from asyncloader._worker.transport import TensorValue, WithArrays, from_shared

__all__ = [
    "LOST",
    "STOP",
    "SUPERSEDED",
    "BatchFetcher",
    "BatchPlan",
    "Ended",
    "Fetcher",
    "Keyed",
    "NextOfStream",
    "OpenStream",
    "Pooled",
    "Request",
    "Returns",
    "RunBatch",
    "Running",
    "StreamOpen",
    "TensorValue",
    "WithArrays",
    "WorkerConfig",
    "WorkerCore",
    "WorkerSpec",
    "batch_of",
    "batch_tensor",
    "collate_small",
    "empty_huge",
    "fetch_then_run",
    "from_shared",
    "init_failure",
    "init_worker",
    "read_answer",
    "run_batch",
    "run_batch_traced",
    "serve",
    "serve_on",
    "setup_worker",
    "shares_batches",
]
