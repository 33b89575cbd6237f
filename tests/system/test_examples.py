"""The examples run: each in a fresh interpreter, at a small size, in a session of its own
(every process it starts must exit with it), checked by its exit code and what it prints."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.helpers.paths import REPO
from tests.helpers.processes import run_job

pytestmark = pytest.mark.timeout(120)

EXAMPLES = REPO / "examples"
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


def test_pretrain_text_resumes_mid_epoch_from_its_checkpoint(tmp_path, seaweed):
    """Parquet token files on an S3 store, mixed, packed and cached: stopped at step 30 (in
    its second epoch) and run again, it continues from there and ends its two epochs."""
    store = seaweed.storage_options
    command = [
        sys.executable, str(EXAMPLES / "pretrain_text.py"), "--checkpoint",
        str(tmp_path / "ck.pt"), "--endpoint", store["client_kwargs"]["endpoint_url"],
        "--key", store["key"], "--secret", store["secret"], "--bucket", "testbucket",
    ]  # fmt: skip
    first = run_job(
        [*command, "--stop-at", "30"], dict(os.environ), tmp_path, timeout=RUN_S, grace=GRACE_S
    )
    assert first.returncode == 0, first.stdout
    assert re.search(r"^epoch 1: step \d+; loss [\d.]+; \d+ rows$", first.stdout, re.MULTILINE)
    assert "saved model and loader at step 30" in first.stdout
    second = run_job(command, dict(os.environ), tmp_path, timeout=RUN_S, grace=GRACE_S)
    assert second.returncode == 0, second.stdout
    assert "resumed at epoch 1 step 30" in second.stdout
    ends = re.findall(r"^epoch 2: step (\d+);", second.stdout, re.MULTILINE)
    assert len(ends) == 1 and int(ends[0]) > 30, second.stdout


def test_trace_epoch_names_each_bottleneck_and_writes_its_trace_and_page(tmp_path):
    """The tracing example as a user runs it: the fetch-bound loader is named storage, the
    CPU-bound one cpu, and each leaves a trace and a page."""
    command = [sys.executable, str(EXAMPLES / "trace_epoch.py"), "--out", str(tmp_path)]
    done = run_job([*command, "--samples", "384"], dict(os.environ), tmp_path,
                   timeout=RUN_S, grace=GRACE_S)  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "fetch-bound: bottleneck: storage" in done.stdout, done.stdout
    assert "cpu-bound: bottleneck: cpu" in done.stdout, done.stdout
    for name in ("fetch-bound", "cpu-bound"):
        assert (tmp_path / f"{name}.json").stat().st_size > 0
        assert "training process: MainThread" in (tmp_path / f"{name}.html").read_text()
