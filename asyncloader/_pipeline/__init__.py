"""The pipeline of one epoch in the training process: its start (decided at ``iter()``), the
running epoch's stages in one TaskGroup (batch numbering, the fetch, the transform through an
engine, iterable sources run in the workers, the reorder buffer, the device stage), the
sync and async iterators the consumer holds, and what the loader does between and around
epochs (its checkpoint state, ``len()``, the next epoch's options, closing).

Imports: every private layer below it (:mod:`asyncloader._engines`,
:mod:`asyncloader._checkpoint`, :mod:`asyncloader._worker`, :mod:`asyncloader._tuning`,
:mod:`asyncloader._config`, :mod:`asyncloader._base`), :mod:`asyncloader.errors` and its own
modules.
"""

from __future__ import annotations

from asyncloader._pipeline.async_iterator import AsyncIterator
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.epoch_start import start_epoch, tell_rank, with_sampler
from asyncloader._pipeline.length import ReportedLength
from asyncloader._pipeline.loader_epochs import batches_per_epoch, next_epoch_options
from asyncloader._pipeline.loader_state import loaded_state, saved_state
from asyncloader._pipeline.shutdown import aclose_loader, close_loader, release
from asyncloader._pipeline.stall_dump import dump_epochs
from asyncloader._pipeline.sync_iterator import LoopThread, SyncIterator

__all__ = [
    "AsyncIterator",
    "Epoch",
    "LoopThread",
    "ReportedLength",
    "SyncIterator",
    "aclose_loader",
    "batches_per_epoch",
    "close_loader",
    "dump_epochs",
    "loaded_state",
    "next_epoch_options",
    "release",
    "saved_state",
    "start_epoch",
    "tell_rank",
    "with_sampler",
]
