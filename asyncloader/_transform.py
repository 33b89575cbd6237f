"""Executor offload with a bounded in-flight window.

One task per batch runs :func:`asyncloader._worker.run_batch` (fetch when the executor holds
the dataset, then transform and collate). At most ``window`` batches are in the executor at
once: ``slots.value + submitted == window`` at every await point.

When the plan holds only torch's default collate (no dataset, no transform, no per-sample
seeding), a batch smaller than :data:`INLINE_COLLATE_BYTES` may be collated right on the event
loop instead: a copy of a few KiB costs less than the two thread hops (and the GIL hand-offs)
of a trip through the executor. There, :func:`collate_small` stacks numeric numpy samples in
one numpy call instead of a tensor per sample.
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
from torch.utils.data import default_collate, default_convert

from asyncloader._threads import run_in_thread
from asyncloader._worker import BatchPlan, from_shared, nbytes, run_batch
from asyncloader.errors import WorkerCrashedError

#: Batches below this size that need only the default collate may be collated on the loop: a
#: copy of at most this much takes microseconds, less than the thread hops it saves, and is
#: too small to be worth torch's intra-op thread pool.
INLINE_COLLATE_BYTES = 64 * 1024


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
        inline: May collate small batches on the loop (see the module docstring): only for
            an executor of the loader's own threads, which the loop would otherwise wait on.
    """

    __slots__ = (
        "_crash_details",
        "_epoch_seed",
        "_executor",
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
        inline: bool = False,
    ) -> None:
        self._executor = executor
        # The plan to run on the loop, or None: collate must be all there is to do.
        self._inline_plan: BatchPlan | None = None
        if (
            inline
            and plan is not None
            and plan.dataset is None
            and plan.transform is None
            and plan.collate in (default_collate, default_convert)
            and epoch_seed is None
        ):
            self._inline_plan = plan
            if plan.collate is default_collate:
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
        inline = self._inline_plan
        if inline and samples and nbytes(samples[0]) * len(samples) < INLINE_COLLATE_BYTES:
            return run_batch(inline, seq, indices, samples, None)
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
