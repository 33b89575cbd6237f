"""A job of two ranks writes a trace per rank, and ``python -m asyncloader.trace merge``
joins them (the rest of the trace's tests: tests/integration/test_trace.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration.test_trace import SCRIPT, events, names_of


def test_every_rank_writes_its_trace_and_merge_joins_them(tmp_path):
    """ASYNCLOADER_TRACE in fresh interpreters (ranks 0 and 1), then the merge command: one
    process group per rank, labelled, on one time axis."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    folder = tmp_path / "traces"
    for rank in (0, 1):
        env = {**os.environ, "ASYNCLOADER_TRACE": str(folder), "RANK": str(rank)}
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120)
    files = sorted(folder.glob("*.json"))
    assert [f.name.split("-")[-2] for f in files] == ["rank0", "rank1"]
    out = tmp_path / "job.json"
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "asyncloader.trace", "merge",
         str(folder), "-o", str(out)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert "merged 2 traces" in done.stdout
    merged = events(out)
    labels = set(names_of(merged, "process_name").values())
    assert {"rank 0: training process", "rank 1: training process"} <= labels
    assert {"rank 0: worker 0", "rank 1: worker 0"} <= labels
    waits = [e for e in merged if e["ph"] == "X" and e["name"].startswith("wait for batch")]
    assert len(waits) == 8 and min(e["ts"] for e in merged if "ts" in e) == 0
    assert len({e["pid"] for e in waits}) == 2
