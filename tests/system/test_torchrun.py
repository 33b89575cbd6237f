"""Multi-rank under torchrun (gloo, CPU): each epoch's union over ranks is the dataset once,
every rank makes the same steps, and a job killed mid-epoch resumes at another world size.

Three jobs, one after the other: 3 ranks with a map-style and a sharded loader (2 workers per
rank), killed at epoch 1, step 1; the map-style loader resumed at 2 ranks (elastic); the
sharded one resumed at 2 ranks too (elastic: the remainder of its workers' streams).
"""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import shard_set
from tests.helpers.paths import REPO
from tests.helpers.processes import run_job
from tests.system.torchrun_scripts.job import MAP_SAMPLES

pytestmark = pytest.mark.timeout(240)

ROOT = REPO
JOB = Path(__file__).resolve().parent / "torchrun_scripts" / "job.py"
DDP_EXAMPLE = ROOT / "examples" / "ddp_train.py"
SHARD_COUNTS = [5, 7, 4, 6, 5, 3]  # 30 samples: 10 per rank of 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    ranks: int, *args: str, script: Path = JOB, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs ``script`` at ``ranks`` ranks on 127.0.0.1 (``env`` added to the environment);
    afterwards no process of it is left."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={ranks}", "--nnodes=1", "--node_rank=0",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--max_restarts=0",
        str(script), *args,
    ]  # fmt: skip
    return run_job(command, env, ROOT, timeout=150, grace=30)


def steps(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def taken(records: list[dict], kind: str, epoch: int) -> list:
    """What every rank got of ``kind`` in ``epoch``; checks that the ranks stepped together."""
    out = []
    for record in records:
        if record["epoch"] != epoch:
            continue
        present = [kind in got for got in record["ranks"]]
        assert all(present) or not any(present), f"ranks made different steps: {record}"
        out += [x for got in record["ranks"] for x in got.get(kind, [])]
    return out


def check_rank_traces_and_waits(traces: Path, stats: Path, merged: Path) -> None:
    """Every rank wrote its trace (ASYNCLOADER_TRACE), the merge labels each rank's
    processes, and stats_by_rank gave each rank's wait percentiles."""
    assert sorted(p.name.split("-")[-2] for p in traces.glob("*.json")) == ["rank0", "rank1"]
    subprocess.run(
        [sys.executable, "-m", "asyncloader.trace", "merge", str(traces), "-o", str(merged)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    events = json.loads(merged.read_text())["traceEvents"]
    labels = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    for rank in (0, 1):
        assert {f"rank {rank}: training process", f"rank {rank}: worker 0"} <= labels, labels
    epochs = [json.loads(line) for line in stats.read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2]
    for epoch in epochs:
        assert len(epoch["ranks"]) == 2  # [batches, p50, p95, p99] of each rank
        assert all(r[0] > 2 and 0 <= r[1] <= r[2] <= r[3] for r in epoch["ranks"]), epoch


def test_ranks_cover_each_epoch_once_and_resume_at_another_world_size(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for name, data in shard_set(len(SHARD_COUNTS), SHARD_COUNTS).items():
        (shards / name).write_bytes(data)
    keys = sorted(f"s{s:03d}-{i:04d}" for s, n in enumerate(SHARD_COUNTS) for i in range(n))
    ckpt = tmp_path / "checkpoint.json"
    common = ["--shards", str(shards), "--checkpoint", str(ckpt)]

    first = torchrun(
        3, *common, "--epochs", "3", "--record", str(tmp_path / "a"), "--crash-at", "1", "1"
    )
    saved = ckpt.read_text()
    assert first.returncode != 0, first.stdout
    a = steps(tmp_path / "a")
    assert sorted(taken(a, "map", 0)) == list(range(MAP_SAMPLES)), first.stdout
    assert sorted(taken(a, "sharded", 0)) == keys
    assert [r["step"] for r in a if r["epoch"] == 1] == [0, 1]  # killed mid-epoch

    traces, stats = tmp_path / "traces", tmp_path / "stats"
    second = torchrun(
        2, *common, "--kinds", "map", "--resume", "--epochs", "3", "--record", str(tmp_path / "b"),
        "--stats", str(stats), env={"ASYNCLOADER_TRACE": str(traces)},
    )  # fmt: skip
    assert second.returncode == 0, second.stdout
    check_rank_traces_and_waits(traces, stats, tmp_path / "job.json")
    b = steps(tmp_path / "b")
    assert sorted(taken(a, "map", 1) + taken(b, "map", 1)) == list(range(MAP_SAMPLES))
    assert sorted(taken(b, "map", 2)) == list(range(MAP_SAMPLES))

    ckpt.write_text(saved)  # the second job checkpointed too
    sharded = ["--kinds", "sharded", "--resume", "--epochs", "3"]
    third = torchrun(2, *common, *sharded, "--record", str(tmp_path / "c"))
    assert third.returncode == 0, third.stdout
    c = steps(tmp_path / "c")
    # 24 of epoch 1's 30 samples went out at 3 ranks (2 steps, 2 workers each): the 6 left,
    # 3 per rank at 2, each once; then epoch 2 whole at 2 ranks
    assert Counter(taken(a, "sharded", 1) + taken(c, "sharded", 1)) == Counter(keys)
    assert sorted(taken(c, "sharded", 2)) == keys


def test_the_ddp_example_resumes_on_another_number_of_ranks(tmp_path):
    """examples/ddp_train.py: stopped after 3 of epoch 0's 4 steps at 2 ranks (384 of 512
    samples), it resumes at 1 rank and takes the 128 left: 2 steps of 64."""
    ckpt = str(tmp_path / "ddp.pt")
    args = ["--samples", "512", "--epochs", "1", "--checkpoint", ckpt]
    first = torchrun(2, *args, "--stop-after", "3", script=DDP_EXAMPLE)
    assert first.returncode == 0 and "epoch 0: 3 steps per rank" in first.stdout, first.stdout
    second = torchrun(1, *args, script=DDP_EXAMPLE)
    assert second.returncode == 0, second.stdout
    assert "resumed at step 3 (saved by 2 ranks, now 1)" in second.stdout
    assert "epoch 0: 2 steps per rank" in second.stdout, second.stdout
