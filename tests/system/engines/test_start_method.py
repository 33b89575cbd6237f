"""Start methods: DataLoader's default whatever threads run; with a start method that pickles,
an unguarded script and what cannot be pickled are refused at once with the fix; the fork
server is started ahead of the first epoch that needs it."""

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import REPO

ROOT = REPO

HEADER = """
import threading, time
import numpy as np
from asyncloader import AsyncLoader

class DS:
    def __len__(self): return 16
    def __getitem__(self, i): return np.full(2, i)

MP = None
stop = threading.Event()
if THREAD:
    threading.Thread(target=stop.wait, name="user-thread", daemon=True).start()
"""


def run_script(tmp_path, body, thread, timeout=60, mp=None):
    """Runs a script (HEADER + body) in a fresh interpreter; returns the finished process."""
    script = tmp_path / "train.py"
    source = f"THREAD = {thread}\n" + HEADER + f"MP = {mp!r}\n" + textwrap.dedent(body)
    script.write_text(source)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


UNGUARDED = """
total = sum(len(b) for b in AsyncLoader(DS(), batch_size=4, num_workers=2, mp_context=MP))
print("total", total)
"""

GUARDED = """
def main():
    loader = AsyncLoader(DS(), batch_size=4, num_workers=2, mp_context=MP)
    print("total", sum(len(b) for b in loader))

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("mp", ["spawn", "forkserver"])
def test_an_unguarded_script_is_refused_naming_the_fix_where_workers_rerun_it(tmp_path, mp):
    """Workers that would re-run the script are refused at iter(), with the fix, at once."""
    code, out, err = run_script(tmp_path, UNGUARDED, thread=True, timeout=30, mp=mp)
    assert code == 1 and "total" not in out
    assert f"RuntimeError: asyncloader: the workers start with {mp!r}" in err
    assert 'if __name__ == "__main__":' in err and 'mp_context="fork"' in err
    assert "train.py:" in err


@pytest.mark.parametrize(
    ("body", "thread", "mp"),
    [(UNGUARDED, True, None), (UNGUARDED, False, None), (GUARDED, True, "forkserver")],
)
def test_forked_or_guarded_scripts_run(tmp_path, body, thread, mp):
    """The default start method forks, with or without other threads, so an unguarded script
    runs as under DataLoader; a guarded one runs with the fork server."""
    code, out, err = run_script(tmp_path, body, thread, mp=mp)
    assert code == 0, err
    assert out.split() == ["total", "16"]


def test_the_fork_server_starts_with_the_loader_when_it_will_be_needed(tmp_path):
    """With mp_context="forkserver", constructing the loader starts the fork server, so the
    first epoch does not wait for it; with the default (fork), none is started."""
    body = """
    import psutil
    def server_running():
        kids = [" ".join(p.cmdline()) for p in psutil.Process().children()]
        return any("forkserver" in k for k in kids)

    if __name__ == "__main__":
        forked = AsyncLoader(DS(), batch_size=4, num_workers=2)
        print("after-default", server_running())
        loader = AsyncLoader(DS(), batch_size=4, num_workers=2, mp_context="forkserver")
        print("after-forkserver", server_running())
    """
    code, out, err = run_script(tmp_path, body, thread=True)
    assert code == 0, err
    assert out.split() == ["after-default", "False", "after-forkserver", "True"]
