"""asyncloader's own worker processes: a ProcessPoolExecutor whose workers get the plan once.

Start-up and shutdown are blocking and run off the event loop (see ``_threads.run_in_thread``).
Shutdown follows DataLoader's: workers are asked to exit after their current task, given a
grace period, then terminated, then killed; every process and the pool's own threads are
joined before :meth:`ProcessPool.shutdown` returns.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from asyncloader._config import Config, default_mp_context
from asyncloader._worker import BatchPlan, init_worker
from asyncloader.errors import WorkerCrashedError

SHUTDOWN_GRACE_S = 5.0


def _noop() -> None:
    """A task whose only purpose is to make the executor start a process."""


class ProcessPool:
    """``num_workers`` processes, each holding the batch plan, started eagerly.

    Args:
        config: The loader's options (num_workers, mp_context, worker_init_fn).
        plan: Sent to each worker once, at start.
        base_seed: Worker ``i`` seeds its RNGs with ``base_seed + i``.
    """

    def __init__(self, config: Config, plan: BatchPlan, base_seed: int) -> None:
        ctx = config.mp_context or default_mp_context()
        self.num_workers = config.num_workers
        self._counter = ctx.Value("i", 0)
        self.executor = ProcessPoolExecutor(
            max_workers=config.num_workers,
            mp_context=ctx,
            initializer=init_worker,
            initargs=(self._counter, config.num_workers, base_seed, plan, config.worker_init_fn),
        )
        self._closed = False
        self._processes: dict[int, Any] = {}

    def start(self) -> None:
        """Spawns every worker now (blocking), so the first batches do not wait on serial spawns.

        A non-fork executor spawns one process per submit that finds no idle worker, so as many
        no-op submits as workers start them all.
        """
        try:
            for future in [self.executor.submit(_noop) for _ in range(self.num_workers)]:
                future.result()
        except BrokenProcessPool as exc:
            raise WorkerCrashedError(
                "a worker process died while starting (its worker_init_fn raised, or the "
                "dataset, transform or collate_fn could not be unpickled; see its log above)"
            ) from exc
        finally:
            # ProcessPoolExecutor forgets dead processes; keep ours to report exit codes and join.
            self._processes = dict(getattr(self.executor, "_processes", None) or {})

    @property
    def broken(self) -> bool:
        """A worker died; the executor accepts no more work."""
        return bool(getattr(self.executor, "_broken", False))

    def describe_crash(self) -> str:
        """Names the workers that exited and how (exit code or signal)."""
        dead = []
        for pid, proc in self._processes.items():
            code = proc.exitcode
            if code is None or code == 0:
                continue
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            dead.append(f"pid {pid} ({how})")
        return f" [{', '.join(dead)}]" if dead else ""

    def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stops every worker and joins them and the pool's threads. Idempotent; blocking."""
        if self._closed:
            return
        self._closed = True
        executor = self.executor
        # ProcessPoolExecutor drops these references in shutdown(); keep them to join.
        live = dict(getattr(executor, "_processes", None) or {})
        processes: list[Any] = list({**self._processes, **live}.values())
        manager = getattr(executor, "_executor_manager_thread", None)
        executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace
        for proc in processes:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
        if manager is not None:
            manager.join()
