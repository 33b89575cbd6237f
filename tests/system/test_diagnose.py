"""``python -m asyncloader.diagnose`` in a fresh interpreter (its functions in this
process: tests/unit/test_diagnose.py)."""

import subprocess
import sys

from tests.helpers.paths import REPO


def test_it_runs_as_a_module():
    root = REPO
    done = subprocess.run(
        [sys.executable, "-m", "asyncloader.diagnose", "tests.unit.test_diagnose:make_loader",
         "--batches", "5"],
        cwd=root, capture_output=True, text=True, timeout=50, check=True,
    )  # fmt: skip
    assert "bottleneck:" in done.stdout
