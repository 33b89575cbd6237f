"""python -m asyncloader.diagnose module:factory: runs a loader alone and prints its report."""

import subprocess
import sys
from pathlib import Path

import pytest

from asyncloader import AsyncLoader
from asyncloader.diagnose import load_factory, main
from tests.helpers import Waiting

pytestmark = pytest.mark.timeout(60)


def make_loader():
    return AsyncLoader(Waiting(400, 0.01), batch_size=4, io_concurrency=4)


def not_a_loader():
    return [1, 2, 3]


def test_it_runs_the_batches_asked_and_names_the_bottleneck(capsys):
    main(["tests.test_diagnose:make_loader", "--batches", "12"])
    out, err = capsys.readouterr()
    assert "12 batches" in err and "waiting for data" in err
    assert "bottleneck: storage: waiting on storage" in out and "raise io_concurrency" in out


def test_a_simulated_step_makes_the_consumer_the_bottleneck(capsys):
    main(["tests.test_diagnose:make_loader", "--batches", "8", "--step-ms", "60"])
    assert "bottleneck: consumer:" in capsys.readouterr().out


def test_bad_arguments_say_what_is_wrong(capsys):
    with pytest.raises(ValueError, match="module:factory"):
        load_factory("tests.test_diagnose")
    with pytest.raises(SystemExit):
        main(["tests.test_diagnose:not_a_loader"])
    assert "returned a list, not an AsyncLoader" in capsys.readouterr().err


def test_it_runs_as_a_module():
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "asyncloader.diagnose", "tests.test_diagnose:make_loader",
         "--batches", "5"],
        cwd=root, capture_output=True, text=True, timeout=50, check=True,
    )  # fmt: skip
    assert "bottleneck:" in done.stdout
