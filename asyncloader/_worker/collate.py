"""torch's ``default_collate``, as the loader runs it where it can do better than as given.

- :func:`collate_small`: a batch of numeric numpy arrays of one shape and dtype is stacked in
  one ``np.stack``, without a ``torch.as_tensor`` per sample.
- :func:`worker_collate`: in a worker of asyncloader's own pool, ``default_collate`` stacks
  every tensor into a fresh shared-memory segment (it does so wherever torch's
  ``get_worker_info()`` answers). A batch below ``BY_VALUE_BYTES`` then travels by value
  anyway (:mod:`asyncloader._worker.transport`), so each segment was made (``shm_open``,
  ``ftruncate``, ``mmap``) only to be copied out and dropped: measured 153 us against 20 us
  for 32 samples of 64 bytes. Such a batch is collated in private memory instead.

Either gives the values, dtypes, shapes and containers ``default_collate`` gives, and its
errors: anything off the fast paths goes to torch's own functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from asyncloader._base import collate_with, nbytes
from asyncloader._worker.process_state import shares_batches
from asyncloader._worker.transport import BY_VALUE_BYTES


def _stackable(samples: list[Any]) -> bool:
    """Numeric native-order numpy arrays, all of the first one's shape and dtype."""
    first = samples[0]
    if type(first) is not np.ndarray or first.dtype.kind not in "biufc":
        return False
    shape, dtype = first.shape, first.dtype
    return dtype.isnative and all(
        type(s) is np.ndarray and s.shape == shape and s.dtype == dtype for s in samples
    )


def collate_small(samples: list[Any]) -> Any:
    """``default_collate(samples)``, numeric numpy samples stacked in one ``np.stack``."""
    if _stackable(samples):
        return torch.from_numpy(np.stack(samples))
    return default_collate(samples)


def _arrays(batch: list[Any], *, default: Callable[..., Any], collate_fn_map: Any) -> Any:
    if _stackable(batch):
        return torch.from_numpy(np.stack(batch))
    return default(batch, collate_fn_map=collate_fn_map)


def _tensors(batch: list[Any], *, default: Callable[..., Any], collate_fn_map: Any) -> Any:
    first = batch[0]
    if type(first) is torch.Tensor and first.layout is torch.strided and not first.is_nested:
        return torch.stack(batch, 0)  # in private memory, where a worker's would be shared
    return default(batch, collate_fn_map=collate_fn_map)


def private_collate(samples: list[Any]) -> Any:
    """``default_collate(samples)`` in private memory, also in a worker."""
    return collate_with(samples, {np.ndarray: _arrays, torch.Tensor: _tensors})


def worker_collate(collate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """What runs ``collate`` here: for torch's ``default_collate`` in a worker of
    asyncloader's pool, :func:`_small_first`; ``collate`` itself anywhere else."""
    if collate is default_collate and shares_batches():
        return _small_first
    return collate


def _small_first(samples: Any) -> Any:
    """A batch that will travel by value (its first sample times their number below
    ``BY_VALUE_BYTES``) collated privately; a larger one by ``default_collate``, straight
    into shared memory."""
    if isinstance(samples, list) and samples and nbytes(samples[0]) * len(samples) < BY_VALUE_BYTES:
        return private_collate(samples)
    return default_collate(samples)
