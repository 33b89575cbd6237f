"""Executor offload with a bounded in-flight window.

One task per batch runs :func:`asyncloader._worker.run_batch` (fetch when the executor holds
the dataset, then transform and collate). At most ``window`` batches are in the executor at
once: ``slots.value + submitted == window`` at every await point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from asyncloader._threads import run_in_thread
from asyncloader._worker import BatchPlan, from_shared, run_batch
from asyncloader.errors import WorkerCrashedError


class Transformer:
    """Submits batches to ``executor``, at most ``window`` at once.

    Args:
        executor: Where batches are processed.
        window: Batches at most in the executor.
        plan: Sent with each task, or ``None`` when the executor's workers already hold it.
        crash_details: Called on a broken pool to describe the dead workers.
    """

    def __init__(
        self,
        executor: Executor,
        window: int,
        plan: BatchPlan | None,
        epoch_seed: int | None = None,
        crash_details: Callable[[], str] | None = None,
    ) -> None:
        self._executor = executor
        self._slots = asyncio.Semaphore(window)
        self._plan = plan
        self._epoch_seed = epoch_seed
        self._crash_details = crash_details

    async def run(self, seq: int, indices: Sequence[Any], samples: list[Any] | None) -> Any:
        """Returns batch ``seq`` (or its Failure).

        Raises:
            WorkerCrashedError: A worker process died while the pool held this batch.
        """
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
