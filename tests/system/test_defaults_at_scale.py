"""The defaults at a realistic scale: epochs of 20,000 samples of 2, 5 and 20 ms, batch 64,
every option at its default, in each placement, each placement in a fresh interpreter
(tests/system/scale_scripts/default_epochs.py; a session of its own, reaped with every process it
started). Every sample arrives once and in order; an epoch in which no batch arrives for
30 s has its state dumped (``asyncloader.diagnose.dump_state``) and fails the test with it.

About 45 s in all on 2 cores: the three epochs of a placement take 2 to 17 s, the
interpreter's start and torch's import 2 s more.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from asyncloader._base.validate import STALL_DUMP_ENV
from tests.helpers.processes import run_job

SCRIPT = Path(__file__).resolve().parent / "scale_scripts" / "default_epochs.py"
ROOT = SCRIPT.parents[2]
LATENCIES_MS = (2, 5, 20)
#: Seconds a child may run (its 30 s watchdog fires first on a hang), and seconds its worker
#: processes may outlive it.
CHILD_S, GRACE_S = 100.0, 15.0
#: The exit status of a child whose watchdog fired (see the script).
STALLED = 3


def _run(*args: str) -> tuple[int, str]:
    """Runs the script with ``args``; its exit status and its output (stdout and stderr)."""
    env = {name: value for name, value in os.environ.items() if name != STALL_DUMP_ENV}
    done = run_job([sys.executable, str(SCRIPT), *args], env, ROOT, timeout=CHILD_S, grace=GRACE_S)
    return done.returncode, done.stdout


@pytest.mark.timeout(CHILD_S + GRACE_S + 15)
@pytest.mark.parametrize(
    "placement",
    [
        pytest.param("loop", id="loop"),  # num_workers=0: fetched on the loader's loop
        pytest.param("fetch_threads", id="fetch_threads"),  # sync __getitem__, 64 threads
        pytest.param("workers", id="workers"),  # num_workers=2
        pytest.param("fetch_in_workers", id="fetch_in_workers"),  # num_workers=2, fetched there
    ],
)
def test_epochs_of_20000_samples_with_the_defaults(placement):
    """Three epochs (2, 5 and 20 ms a sample) of 20,000 samples: each complete, in order,
    with no 30 s without a batch."""
    status, output = _run(placement, *map(str, LATENCIES_MS))
    assert status == 0, f"{placement}: exit status {status}\n{output}"
    epochs = re.findall(rf"^epoch {placement} (\d+) ms: ([\d.]+) s, 20000 samples", output, re.M)
    assert [int(ms) for ms, _ in epochs] == list(LATENCIES_MS), output
    print(output)  # the epochs' times, shown under pytest -s


@pytest.mark.timeout(60)
def test_the_watchdog_dumps_a_stalled_epoch_and_fails_it():
    """A sample that never arrives (the script's ``stuck`` placement, a 2 s watchdog): the
    child writes the epoch's stages, the loop's tasks (the waiting ``__getitem__`` among
    them) and every thread's stack, and exits with its own status."""
    status, output = _run("stuck", "2", "--watchdog-s", "2", "--samples", "2000")
    assert status == STALLED, output
    assert "WATCHDOG: no batch for 2 s in stuck at 2 ms" in output
    for part in ("stages:", "limits:", "tuner moves", "tasks on ", "threads ("):
        assert part in output, (part, output)
    assert "await asyncio.Event().wait()" in output, output
    assert "batch 1 (indices [64, 65," in output, output
