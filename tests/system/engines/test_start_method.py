"""Start methods: DataLoader's default whatever threads run; with a start method that pickles,
an unguarded script and what cannot be pickled are refused at once with the fix; the fork
server is started ahead of the first epoch that needs it."""

import subprocess
import sys
import textwrap

import pytest

import asyncloader._engines.start_method as start_method
from asyncloader._engines.start_method import _guarded_lines, _is_main_test
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


def test_default_start_method_is_multiprocessings_default(monkeypatch):
    """No start method named: multiprocessing's default, as DataLoader (fork on Linux before
    3.14), or the one set with set_start_method."""
    import multiprocessing

    expected = (
        multiprocessing.get_start_method(allow_none=True)
        or (multiprocessing.get_all_start_methods()[0])
    )
    assert start_method.default_mp_context().get_start_method() == expected
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    assert start_method.default_mp_context().get_start_method() == "spawn"


def test_main_guard_detection():
    """Only `if __name__ == "__main__":` at top level (either way round) counts as a guard."""
    import ast

    def test_of(src):
        return ast.parse(src).body[0].test

    assert _is_main_test(test_of('if __name__ == "__main__": pass'))
    assert _is_main_test(test_of('if "__main__" == __name__: pass'))
    assert not _is_main_test(test_of('if __name__ != "__main__": pass'))
    assert not _is_main_test(test_of("if x == '__main__': pass"))


def test_guarded_lines_cover_the_whole_block(tmp_path):
    """Every line of a main block counts as guarded, none outside it."""
    script = tmp_path / "s.py"
    script.write_text('a = 1\nif __name__ == "__main__":\n    b = 2\n    c = 3\nd = 4\n')
    assert _guarded_lines(str(script)) == frozenset({2, 3, 4})
