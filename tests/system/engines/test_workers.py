"""Workers started as fresh interpreters (spawn, the fork server) and a script that forks
while a loader is collected: the dataset is shipped once per worker, crashes and
``worker_init_fn`` errors are reported as under fork (tests/integration/engines/test_workers.py)."""

import os
import signal
import subprocess
import sys

import pytest

from asyncloader import AsyncLoader, RemoteTraceback, WorkerCrashedError
from tests.helpers import (
    AsyncSource,
    SyncSource,
    indices_of,
    worker_processes,
)
from tests.integration.engines.test_workers import (
    COLLECTED_AT_FORK,
    ROOT,
    CountedPickles,
    InitError,
    failing_init,
    with_pid,
)


@pytest.mark.parametrize(("mp_context", "pickles"), [("forkserver", 3), ("spawn", 3), (None, 0)])
def test_dataset_is_shipped_once_per_worker_not_per_task(mp_context, pickles):
    """50 batches, 2 workers: the dataset is pickled once per worker at start, and once before
    to check it can be (not at all when the workers are forked, the default), never per
    task."""
    CountedPickles.pickled = 0
    loader = AsyncLoader(CountedPickles(100), batch_size=2, num_workers=2, mp_context=mp_context)
    assert indices_of(loader) == list(range(100))
    assert CountedPickles.pickled == pickles


def test_mp_context_is_honoured():
    """mp_context='spawn' starts spawned workers that work."""
    loader = AsyncLoader(SyncSource(20), batch_size=5, num_workers=2, mp_context="spawn")
    assert indices_of(loader) == list(range(20))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mp_context", [None, "forkserver"])
def test_a_worker_killed_from_outside_mid_epoch_is_reported(mp_context):
    """SIGKILL sent to a worker by someone else fails the epoch instead of hanging it."""
    before = worker_processes()
    loader = AsyncLoader(
        AsyncSource(4000), batch_size=4, num_workers=2, collate_fn=with_pid, mp_context=mp_context
    )
    it = iter(loader)
    victim = next(it)["pid"]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError, match=rf"\(pid {victim}\) is killed by signal: Killed"):
        for _ in it:
            pass
    assert worker_processes() == before


@pytest.mark.parametrize("mp_context", [None, "spawn"])
def test_worker_init_fn_error_keeps_its_type_message_and_traceback(mp_context):
    """A worker_init_fn that raises reaches the consumer as itself, as in DataLoader, with
    the worker's traceback and a note naming the stage; no worker is left behind."""
    before = worker_processes()
    loader = AsyncLoader(
        SyncSource(8), batch_size=4, num_workers=2, worker_init_fn=failing_init,
        mp_context=mp_context,
    )  # fmt: skip
    with pytest.raises(InitError, match=r"no GPU for worker \d") as info:
        list(loader)
    assert info.value.worker in (0, 1)
    assert any(n.startswith("asyncloader: stage=worker_init worker=") for n in info.value.__notes__)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "failing_init raises here" in info.value.__cause__.tb
    loader.close()
    assert worker_processes() == before


def test_a_loader_collected_while_workers_fork_does_not_wait_for_its_parked_loop():
    """A loader and its running epoch that garbage collection finalizes inside the fork
    (an at-fork hook, or the fork's own allocations) close in the background: waiting for
    their loop thread, which is parked for that fork, would hang the training process."""
    proc = subprocess.run(
        [sys.executable, "-c", COLLECTED_AT_FORK], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]
