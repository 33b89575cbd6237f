"""Process hygiene: workers die with the training process, a process that raises
while it holds an iterator exits, and exit leaves the resource tracker nothing to clean up.

Each check runs a real training process, a script of ``tests/system/engines/hygiene_scripts``
started with
this interpreter in a session of its own, and waits on conditions only: a line the script
prints, a pidfd becoming readable, its output closing. Whatever a test sees, its way out kills
the script's whole process group, so a broken build leaves no worker behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from asyncloader import AsyncLoader
from tests.helpers import SyncSource, indices_of
from tests.helpers.paths import REPO
from tests.helpers.processes import Exits

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="pidfds, /proc and /dev/shm are Linux's"
)

ROOT = REPO
SCRIPTS = Path(__file__).resolve().parent / "hygiene_scripts"
SHM = Path("/dev/shm")
#: Seconds a script may take to import torch and asyncloader, start its workers (and fork
#: server) and print its first line, on a loaded 2-core machine.
START_S = 25.0
#: Workers must be gone this long after the training process was killed.
ORPHAN_EXIT_S = 5.0
#: A process that raised must have exited this long after: "never hangs" (item 2).
RAISE_EXIT_S = 15.0


class Script:
    """A running script: its stdout read line by line with deadlines, its exit waited for.

    The script is never reaped before the test ends, so its pid keeps naming its process
    group, which :func:`script` kills on the way out.
    """

    def __init__(self, proc: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.proc = proc
        self._stderr_path = stderr_path
        self._pidfd = os.pidfd_open(proc.pid)
        assert proc.stdout is not None
        self._out = proc.stdout.fileno()
        self._buffer = b""
        self._closed = False

    def line(self, timeout: float) -> str:
        """The next line the script prints, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._closed:
                raise AssertionError(f"the script's output ended; stderr:\n{self.stderr()}")
            self._read(deadline, f"no line within {timeout}s")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def output_closed(self, timeout: float) -> None:
        """Waits until every process holding the script's stdout (the script and all it
        started: workers, fork server, resource tracker) has exited or closed it."""
        deadline = time.monotonic() + timeout
        while not self._closed:
            self._read(deadline, f"a process the script started holds its output after {timeout}s")

    def _read(self, deadline: float, failure: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self._out], [], [], left)[0]:
            raise AssertionError(f"{failure}; stderr:\n{self.stderr()}")
        chunk = os.read(self._out, 65536)
        self._buffer += chunk
        self._closed = not chunk

    def wait(self, timeout: float) -> int:
        """The script's exit code (``-signal`` if a signal ended it), once it has exited,
        waiting at most ``timeout`` seconds; it is left unreaped."""
        if not select.select([self._pidfd], [], [], timeout)[0]:
            raise AssertionError(f"still running after {timeout}s; stderr:\n{self.stderr()}")
        info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        assert info is not None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def close(self) -> None:
        os.close(self._pidfd)


@contextlib.contextmanager
def script(name: str, *args: object, tmp_path: Path) -> Iterator[Script]:
    """Runs ``tests/system/engines/hygiene_scripts/NAME ARGS`` from this tree, in a session of its
    own; on the
    way out SIGKILLs its process group (whatever is left of it) and reaps the script."""
    stderr_path = tmp_path / f"{name}.stderr"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / name), *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    running = None
    try:
        running = Script(proc, stderr_path)
        yield running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        if running is not None:
            running.close()


def describe(pids: Iterable[int]) -> str:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            out.append(f"{pid} ({proc.status()}, parent {proc.ppid()}): {proc.cmdline()[-3:]}")
    return "; ".join(out)


def shm_used_by(pids: Iterable[int]) -> set[str]:
    """Entries of /dev/shm that processes ``pids`` have mapped or open now, and those named
    after one of them (torch's ``torch_<pid>_*`` segments)."""
    pids = list(pids)
    used = set()
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            used.update(
                line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line
            )
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        used.add(target.removeprefix("/dev/shm/").split()[0])
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    return used | {entry.name for entry in SHM.iterdir() if entry.name.startswith(prefixes)}


#: Where the training loop runs -> the script's arguments (where it iterates, mp_context).
START_PATHS = {
    "main-thread-fork": ("main", "default"),
    "other-thread-fork": ("thread", "default"),
    "other-thread-forkserver": ("thread", "forkserver"),
    # The fetching workers (fetch_in_workers=True), forked and from the fork server.
    "fetch-in-workers-fork": ("main", "default", "fetch-in-workers"),
    "fetch-in-workers-forkserver": ("thread", "forkserver", "fetch-in-workers"),
}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("path", list(START_PATHS))
def test_workers_exit_within_seconds_of_the_training_process_death(
    path, sig, tmp_path, record_property
):
    """Killing a training process mid-epoch ends every process it started (workers, fork
    server, resource tracker) within 5 s, and none of the /dev/shm entries they used is left."""
    # /dev/shm is compared before and after, ignoring new entries that none of these processes
    # had mapped or open (nor named after its pid) just before the kill: other test runs on
    # the machine make, and sometimes leak, their own.
    shm_before = {entry.name for entry in SHM.iterdir()}
    with script("train_forever.py", *START_PATHS[path], tmp_path=tmp_path) as child:
        assert child.line(START_S) == "ready"
        family = psutil.Process(child.proc.pid).children(recursive=True)
        assert len(family) >= 2, f"expected 2 workers at least, found {describe(family)}"
        ours = shm_used_by([child.proc.pid, *(proc.pid for proc in family)]) - shm_before
        if START_PATHS[path] == ("thread", "forkserver"):
            assert ours, "the fork server's workers map the pool's named semaphores"
        exits = Exits(family)
        try:
            killed = time.monotonic()
            child.proc.send_signal(sig)
            left = exits.wait(ORPHAN_EXIT_S)
            took = time.monotonic() - killed
        finally:
            exits.close()
        record_property("exit_s", round(took, 3))
        gone = len(family) - len(left)
        print(f"{path} {sig.name}: {gone} of {len(family)} processes gone {took:.2f}s after it")
        assert not left, f"alive {ORPHAN_EXIT_S}s after {sig.name}: {describe(left)}"
        assert child.wait(ORPHAN_EXIT_S) == -sig
        assert ours & {entry.name for entry in SHM.iterdir()} == set()


def test_workers_forked_from_a_short_lived_thread_live_through_the_epoch():
    """With mp_context="fork" in a non-main thread the workers outlive the helper thread that
    forked them (no parent-death signal bound to it): a full epoch completes."""
    outcome: dict[str, object] = {}

    def train() -> None:
        try:
            loader = AsyncLoader(SyncSource(200), batch_size=4, num_workers=2, mp_context="fork")
            batches = iter(loader)
            got = [next(batches)]
            # The workers now run without the thread that started them.
            for thread in threading.enumerate():
                if thread.name.startswith("asyncloader-start"):
                    thread.join(10)
            got += list(batches)
            outcome["indices"] = indices_of(got)
            loader.close()
        except BaseException as exc:
            outcome["error"] = exc

    trainer = threading.Thread(target=train, name="trainer", daemon=True)
    trainer.start()
    trainer.join(30)
    assert not trainer.is_alive(), "the epoch did not finish within 30 s"
    assert "error" not in outcome, repr(outcome["error"])
    assert outcome["indices"] == list(range(200))


@pytest.mark.parametrize("how", ["plain", "fork", "spawn"])
def test_a_process_that_raises_with_a_live_iterator_exits(how, tmp_path, record_property):
    """A step that raises while the process holds an iterator (1 worker, a million 10 ms
    samples to go) ends that process with exit code 1 within 15 s, as a script and as a
    multiprocessing child (fork, spawn), and everything it started goes with it."""
    with script("raise_in_loop.py", how, RAISE_EXIT_S, tmp_path=tmp_path) as child:
        assert child.line(START_S) == "raising"
        raised = time.monotonic()
        if how == "plain":
            code: int | None = child.wait(RAISE_EXIT_S)
        else:  # the script joins its child for RAISE_EXIT_S at most, then reports
            reply = child.line(RAISE_EXIT_S + 5)
            assert re.fullmatch(r"exitcode (-?\d+|None)", reply), reply
            code = None if reply.endswith("None") else int(reply.split()[1])
        took = time.monotonic() - raised
        record_property("exit_s", round(took, 3))
        print(f"{how}: the process that raised exited {took:.2f}s after raising")
        assert code == 1, f"exit code {code} ({how}); stderr:\n{child.stderr()}"
        assert "RuntimeError: the training step failed" in child.stderr()
        if how != "plain":
            assert child.wait(10) == 0
        child.output_closed(ORPHAN_EXIT_S)


LEAKED = re.compile(r"There appear to be \d+ leaked \w+ objects")


@pytest.mark.parametrize("start", ["default", "forkserver"])
@pytest.mark.parametrize("end", ["finish", "raise"])
def test_exit_leaves_no_leaked_semaphore_warning(end, start, tmp_path):
    """A script with a thread of its own, whose workers are forked (the default: no fork
    server nor resource tracker is started, as under DataLoader) or run under the fork server,
    with persistent_workers off and on, exits without the resource tracker's "leaked
    semaphore" warning, whether it finishes its epochs or raises while it holds live
    iterators."""
    helpers = "" if start == "default" else " forkserver resource_tracker"
    with script("exit_quietly.py", end, start, tmp_path=tmp_path) as child:
        assert child.line(START_S) == "children:" + helpers
        code = child.wait(START_S)
        child.output_closed(ORPHAN_EXIT_S)  # the tracker, which warns as it exits, is gone
        stderr = child.stderr()
    assert code == (0 if end == "finish" else 1), stderr
    assert not LEAKED.search(stderr), stderr
