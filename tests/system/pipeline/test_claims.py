"""The registry of claims on datasets that are their own iterators
(``asyncloader._pipeline.claims``)."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

# A dataset in a reference cycle dies only when the cyclic collector runs; with a threshold of
# 1 it runs inside the next claim_for, under the registry's lock, and runs the dead dataset's
# finalizer there, which takes the same lock on the same thread.
COLLECTED_UNDER_THE_LOCK = textwrap.dedent(
    """
    import gc
    from asyncloader._pipeline.claims import _claims, claim_for

    class Cyclic:
        def __init__(self):
            self.me = self

    for _ in range(200):
        dead = Cyclic()
        claim_for(dead)
        del dead
        gc.set_threshold(1)
        alive = Cyclic()
        claim = claim_for(alive)
        gc.set_threshold(700)
        assert claim_for(alive) is claim
        del alive
    gc.collect()
    print("ok", len(_claims))
    """
)


def test_a_dataset_collected_while_another_is_claimed_does_not_deadlock():
    """It deadlocked a CI run for 15 minutes (the main thread waiting on a lock it held):
    run apart, so that a regression fails here rather than hanging the suite."""
    done = subprocess.run(
        [sys.executable, "-c", COLLECTED_UNDER_THE_LOCK], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "0"]  # every dead dataset's claim forgotten
