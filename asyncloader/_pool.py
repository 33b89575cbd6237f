"""asyncloader's own worker processes: a ProcessPoolExecutor whose workers get the plan once.

Start-up and shutdown are blocking and run off the event loop (see ``_threads.run_in_thread``).
Shutdown follows DataLoader's: workers are asked to exit after their current task, given a
grace period, then terminated, then killed; every process and the pool's own threads are
joined before :meth:`ProcessPool.shutdown` returns.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Mapping, Sequence
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
        ctx: The multiprocessing context; default ``config.mp_context`` or
            :func:`default_mp_context`.
    """

    def __init__(self, config: Config, plan: BatchPlan, base_seed: int, ctx: Any = None) -> None:
        ctx = ctx or config.mp_context or default_mp_context()
        self.num_workers = config.num_workers
        self._counter = ctx.Value("i", 0)
        # [pid, seq of the batch it runs or -1] per worker id, written by the workers.
        self._slots = ctx.Array("q", 2 * config.num_workers, lock=False)
        self.executor = ProcessPoolExecutor(
            max_workers=config.num_workers,
            mp_context=ctx,
            initializer=init_worker,
            initargs=(
                self._counter,
                self._slots,
                config.num_workers,
                base_seed,
                plan,
                config.worker_init_fn,
            ),
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

    def describe_crash(self, inflight: Mapping[int, Sequence[Any]]) -> str:
        """Names the workers that died, how (exit code or signal) and the batch each held.

        Blocking (it waits for the pool to finish breaking): call it off the event loop.

        Args:
            inflight: seq -> indices of the batches not yet handed to the consumer.
        """
        # Read exit codes only once the executor's manager thread has reaped the pool: two
        # threads polling one forkserver sentinel race, and the loser records exit code 255.
        manager = getattr(self.executor, "_executor_manager_thread", None)
        if manager is not None and manager is not threading.current_thread():
            manager.join(SHUTDOWN_GRACE_S)
        running = {self._slots[2 * i]: self._slots[2 * i + 1] for i in range(self.num_workers)}
        dead = []
        for pid, proc in self._processes.items():
            code = proc.exitcode
            if code is None or code == 0 or code == -signal.SIGTERM:
                continue  # alive, or terminated by the pool after the crash
            how = (
                f"killed by signal {signal.Signals(-code).name}"
                if code < 0
                else f"exit code {code}"
            )
            seq = running.get(pid, -1)
            held = (
                f"batch {seq} (indices {list(inflight.get(seq, ()))[:16]})"
                if seq >= 0
                else "no batch"
            )
            hint = ""
            if code == -signal.SIGBUS:
                hint = " (SIGBUS in a worker usually means /dev/shm is full: make it larger)"
            dead.append(f"worker pid {pid} {how} while running {held}{hint}")
        return "; ".join(dead) or "a worker process died (it was already reaped)"

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
            if proc.is_alive():
                proc.kill()
                proc.join()
        if manager is not None:
            manager.join()
        # The counter's lock and the queues held by the Process objects are named semaphores
        # in /dev/shm until collected: drop them now, not when the loader goes.
        self._counter = None
        self._processes = {}
