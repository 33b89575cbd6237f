"""What the workers must be able to receive, under start methods that pickle: a dataset
that leaves its handle out starts under spawn, and a class of a ``__main__`` without a file
(the checks that refuse before any process starts: tests/integration/engines/test_picklable.py)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader._engines.picklable import check_picklable
from tests.integration.engines.test_picklable import (
    MAIN_WITHOUT_FILE,
    ROOT,
    DropsHandle,
)
from tests.integration.engines.test_picklable import handle_file as handle_file  # a fixture


def test_what_pickles_passes_and_the_fix_works(handle_file):
    """A dataset that leaves its handle out of __getstate__ starts under spawn; arrays and
    tensors pass the check without being copied or moved to shared memory."""
    dataset = DropsHandle(handle_file)
    try:
        loader = AsyncLoader(dataset, batch_size=2, num_workers=1, mp_context="spawn")
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    finally:
        dataset.meta["files"][0].close()
    tensor = torch.zeros(4)
    check_picklable({"dataset": [np.zeros(4), tensor]}, "spawn")
    assert not tensor.is_shared()


@pytest.mark.parametrize(("mp", "expect"), [
    ("spawn", "TypeError: asyncloader: the workers start with 'spawn'"),
    (None, "[[0, 1, 4, 9], [16, 25, 36, 49]]"),
])  # fmt: skip
def test_a_class_of_a_main_without_a_file(mp, expect):
    """`python -c` (as a notebook): a dataset class defined in __main__ is named as not
    importable by a spawned worker; with the default start method (fork) it just runs."""
    proc = subprocess.run(
        [sys.executable, "-c", MAIN_WITHOUT_FILE.format(mp=mp)], cwd=ROOT, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout, proc.stdout + proc.stderr
    if mp == "spawn":
        assert "dataset: __main__.Squares" in proc.stdout
        assert "defined in __main__" in proc.stdout and "WorkerCrashedError" not in proc.stderr
