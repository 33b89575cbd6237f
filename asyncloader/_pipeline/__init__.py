"""The pipeline of one epoch in the training process: its start (decided at ``iter()``), the
running epoch's stages in one TaskGroup (batch numbering, the fetch, the transform through an
engine, iterable sources run in the workers, the reorder buffer, the device stage), the
sync and async iterators the consumer holds, and what the loader does between and around
epochs (:class:`LoaderEpochs`: its checkpoint state, ``len()``, the next epoch's options,
stats; closing) and DataLoader's attributes (:class:`DataLoaderAttributes`).

Imports: every private layer below it (:mod:`asyncloader._engines`,
:mod:`asyncloader._checkpoint`, :mod:`asyncloader._worker`, :mod:`asyncloader._tuning`,
:mod:`asyncloader._config`, :mod:`asyncloader._base`), :mod:`asyncloader.errors` and its own
modules.
"""

from __future__ import annotations

from asyncloader._pipeline.async_iterator import AsyncIterator
from asyncloader._pipeline.dataloader_attributes import DataLoaderAttributes
from asyncloader._pipeline.epoch import Epoch
from asyncloader._pipeline.epoch_start import tell_rank
from asyncloader._pipeline.loader_epochs import LoaderEpochs
from asyncloader._pipeline.loader_state import loaded_state
from asyncloader._pipeline.shutdown import aclose_loader, close_loader, release
from asyncloader._pipeline.stall_dump import dump_epochs
from asyncloader._pipeline.sync_iterator import LoopThread, SyncIterator

__all__ = [
    "AsyncIterator",
    "DataLoaderAttributes",
    "Epoch",
    "LoaderEpochs",
    "LoopThread",
    "SyncIterator",
    "aclose_loader",
    "close_loader",
    "dump_epochs",
    "loaded_state",
    "release",
    "tell_rank",
]
