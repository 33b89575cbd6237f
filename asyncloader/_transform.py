"""Executor offload with a bounded in-flight window.

One task per batch runs :func:`asyncloader._worker.run_batch` (fetch when the executor holds
the dataset, then transform and collate). At most ``window`` batches are in the executor at
once: ``slots.value + submitted == window`` at every await point.

A batch that only needs torch's default collate and is smaller than ``inline_below`` bytes is
collated right on the event loop instead: a copy of a few KiB costs less than the two thread
hops (and the GIL hand-offs) of a trip through the executor. There, :func:`collate_small`
stacks numeric numpy samples in one numpy call instead of a tensor per sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from asyncloader._threads import run_in_thread
from asyncloader._worker import BatchPlan, from_shared, nbytes, run_batch
from asyncloader.errors import WorkerCrashedError


def collate_small(samples: list[Any]) -> Any:
    """torch's ``default_collate``, with a fast path for the commonest small batch.

    Numeric numpy arrays of one shape and dtype are stacked by ``np.stack`` and wrapped with
    ``torch.from_numpy``: the same values, dtype and shape as ``default_collate`` gives, without
    a ``torch.as_tensor`` per sample (which costs more than the copy for small samples).
    Anything else goes to ``default_collate`` unchanged, errors included.
    """
    first = samples[0]
    if type(first) is np.ndarray and first.dtype.kind in "biufc" and first.dtype.isnative:
        shape, dtype = first.shape, first.dtype
        if all(type(s) is np.ndarray and s.shape == shape and s.dtype == dtype for s in samples):
            return torch.from_numpy(np.stack(samples))
    return default_collate(samples)


class Transformer:
    """Submits batches to ``executor``, at most ``window`` at once.

    Args:
        executor: Where batches are processed.
        window: Batches at most in the executor.
        plan: Sent with each task, or ``None`` when the executor's workers already hold it.
        crash_details: Called on a broken pool to describe the dead workers.
        inline_below: Collate batches of fewer bytes (estimated from the first sample) on the
            loop; 0 never does. Only for a plan with no transform, torch's default collate and
            no per-sample seeding, whose cost is a copy of those bytes.
    """

    __slots__ = (
        "_crash_details",
        "_epoch_seed",
        "_executor",
        "_inline_below",
        "_inline_plan",
        "_plan",
        "_slots",
    )

    def __init__(
        self,
        executor: Executor,
        window: int,
        plan: BatchPlan | None,
        epoch_seed: int | None = None,
        crash_details: Callable[[], str] | None = None,
        inline_below: int = 0,
    ) -> None:
        self._executor = executor
        self._inline_below = inline_below
        self._inline_plan = plan
        if plan is not None and plan.collate is default_collate:
            self._inline_plan = dataclasses.replace(plan, collate=collate_small)
        self._slots = asyncio.Semaphore(window)
        self._plan = plan
        self._epoch_seed = epoch_seed
        self._crash_details = crash_details

    async def run(self, seq: int, indices: Sequence[Any], samples: list[Any] | None) -> Any:
        """Returns batch ``seq`` (or its Failure).

        Raises:
            WorkerCrashedError: A worker process died while the pool held this batch.
        """
        if (
            self._inline_below
            and samples
            and nbytes(samples[0]) * len(samples) < self._inline_below
        ):
            return run_batch(self._inline_plan, seq, indices, samples, None)
        async with self._slots:
            try:  # submit() itself raises once the pool is broken
                future = self._executor.submit(
                    run_batch, self._plan, seq, indices, samples, self._epoch_seed
                )
                return from_shared(await asyncio.wrap_future(future))
            except BrokenProcessPool as exc:
                details = str(exc)
                if self._crash_details is not None:
                    details = await run_in_thread(self._crash_details, "asyncloader-crash")
                raise WorkerCrashedError(
                    f"{details}. The pool is discarded: iterate the loader again for a fresh one."
                ) from exc
