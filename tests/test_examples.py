"""The examples run: each in a fresh interpreter, at a small size, in a session of its own
(every process it starts must exit with it), checked by its exit code and what it prints."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.processes import run_job

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: Seconds a run may take (it takes 5 to 8 s on a loaded 2-core machine, torch's import
#: included), and seconds its processes may outlive it (a server's, the workers).
RUN_S, GRACE_S = 90.0, 10.0


def test_pretrain_mix_reads_the_second_epoch_from_the_cache(tmp_path):
    """Two epochs of 10 steps of a 0.7/0.3 Mix of two shard sets over HTTP with a DiskCache:
    the second epoch makes no request to the server, every sample is counted to a source,
    and the counts follow the weights."""
    done = run_job(
        [sys.executable, str(EXAMPLES / "pretrain_mix.py"), "--steps", "10"],
        dict(os.environ),
        tmp_path,  # its shards go to tmp_path/.cache
        timeout=RUN_S,
        grace=GRACE_S,
    )
    assert done.returncode == 0, done.stdout
    epochs = re.findall(
        r"^epoch (\d): (\d+) samples \(code (\d+), web (\d+)\); loss [\d.]+; cache: (\d+) hits, "
        r"(\d+) misses$",
        done.stdout,
        re.MULTILINE,
    )
    assert [e[0] for e in epochs] == ["1", "2"], done.stdout
    for _, samples, code, web, _, _ in epochs:
        assert int(code) + int(web) == int(samples) == 160
        assert 0.15 < int(code) / int(samples) < 0.45, done.stdout
    assert int(epochs[0][5]) == 6 and int(epochs[1][5]) == 0, done.stdout  # 6 shards, once
    assert "hit rate" in done.stdout
