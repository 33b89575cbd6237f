"""Start methods: an unguarded script is refused at once with the fix; the fork server is
started ahead of the first epoch that needs it."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncloader._start_method import _guarded_lines, _is_main_test

ROOT = Path(__file__).resolve().parent.parent

HEADER = """
import threading, time
import numpy as np
from asyncloader import AsyncLoader

class DS:
    def __len__(self): return 16
    def __getitem__(self, i): return np.full(2, i)

stop = threading.Event()
if THREAD:
    threading.Thread(target=stop.wait, name="user-thread", daemon=True).start()
"""


def run_script(tmp_path, body, thread, timeout=60):
    """Runs a script (HEADER + body) in a fresh interpreter; returns the finished process."""
    script = tmp_path / "train.py"
    script.write_text(f"THREAD = {thread}\n" + HEADER + textwrap.dedent(body))
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
total = sum(len(b) for b in AsyncLoader(DS(), batch_size=4, num_workers=2))
print("total", total)
"""

GUARDED = """
def main():
    print("total", sum(len(b) for b in AsyncLoader(DS(), batch_size=4, num_workers=2)))

if __name__ == "__main__":
    main()
"""


def test_an_unguarded_script_with_a_thread_is_refused_naming_the_fix(tmp_path):
    """Workers that would re-run the script are refused at iter(), with the fix, at once."""
    code, out, err = run_script(tmp_path, UNGUARDED, thread=True, timeout=30)
    assert code == 1 and "total" not in out
    assert "RuntimeError: asyncloader: the workers would start with 'forkserver'" in err
    assert "user-thread" in err and 'if __name__ == "__main__":' in err
    assert "train.py:" in err


@pytest.mark.parametrize(("body", "thread"), [(GUARDED, True), (UNGUARDED, False)])
def test_guarded_or_single_threaded_scripts_run(tmp_path, body, thread):
    """A guarded script uses the fork server; an unguarded one without threads is forked."""
    code, out, err = run_script(tmp_path, body, thread)
    assert code == 0, err
    assert out.split() == ["total", "16"]


def test_the_fork_server_starts_with_the_loader_when_it_will_be_needed(tmp_path):
    """With other threads running, constructing the loader starts the fork server, so the
    first epoch does not wait for it."""
    body = """
    import psutil
    if __name__ == "__main__":
        loader = AsyncLoader(DS(), batch_size=4, num_workers=2)
        kids = [" ".join(p.cmdline()) for p in psutil.Process().children()]
        print("forkserver-running", any("forkserver" in k for k in kids))
    """
    code, out, err = run_script(tmp_path, body, thread=True)
    assert code == 0, err
    assert out.split() == ["forkserver-running", "True"]


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
