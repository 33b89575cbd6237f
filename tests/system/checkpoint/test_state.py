"""A training script SIGKILLed mid-epoch resumes from its last checkpoint, and the two runs
together deliver every sample once (the state format: tests/integration/checkpoint/)."""

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from tests.integration.checkpoint.test_state import PREEMPTED


@pytest.mark.timeout(60)
def test_a_sigkilled_run_resumes_and_together_they_deliver_every_sample_once(tmp_path):
    """A trainer SIGKILLed after a random checkpoint resumes from the last one it saved; the
    samples committed by its checkpoints and those of the resumed run cover the epoch once."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-c", PREEMPTED, str(tmp_path), "3"]
    victim = subprocess.Popen([*cmd, "train"], stdout=subprocess.PIPE, text=True, env=env)
    stop_after = random.Random().randint(1, 12)
    for _ in range(stop_after):
        assert victim.stdout.readline() == "checkpoint\n"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    subprocess.run([*cmd, "resume"], check=True, env=env, timeout=50)
    delivered = []
    for name in os.listdir(tmp_path):
        if name.endswith(".json"):
            with open(tmp_path / name) as f:
                delivered += json.load(f)["delivered"]
    assert sorted(delivered) == list(range(200)), f"killed after checkpoint {stop_after}"
