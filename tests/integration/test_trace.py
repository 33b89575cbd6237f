"""asyncloader.trace: one Chrome trace of the training process and its workers, read back
as a user would open it; ASYNCLOADER_TRACE and the merge of a job's traces."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import asyncloader
from asyncloader import AsyncLoader
from asyncloader._base import tracing

N, BATCH = 48, 8
BATCHES = N // BATCH


class Slow:
    """An async map-style dataset of samples big enough to leave a worker by shared memory."""

    def __len__(self) -> int:
        return N

    async def __getitem__(self, i: int) -> torch.Tensor:
        await asyncio.sleep(0.001)
        return torch.full((40_000,), i)


class Stream(torch.utils.data.IterableDataset):
    """An iterable that splits itself across workers, as datasets streaming does."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        part, parts = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(part, N, parts):
            yield torch.full((40_000,), i)


def events(path: Path) -> list[dict[str, Any]]:
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] == "ms"
    return document["traceEvents"]


def names_of(trace: list[dict[str, Any]], kind: str) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == kind}


PLACEMENTS = [
    pytest.param(Slow, {}, 0, id="loop"),
    pytest.param(Slow, {"num_workers": 2}, 2, id="workers"),
    pytest.param(Slow, {"num_workers": 2, "fetch_in_workers": True}, 2, id="fetch-in-workers"),
    pytest.param(Stream, {"num_workers": 2, "fetch_in_workers": True}, 2, id="iterable"),
]


@pytest.mark.parametrize(("dataset", "options", "workers"), PLACEMENTS)
def test_a_trace_holds_every_batch_of_every_process(tmp_path, dataset, options, workers):
    """Each batch's wait is one slice named with its number; the workers are processes of
    their own, named; their slices lie inside the epoch on the training process's clock; every
    arrow from a batch's hand-off in a worker ends at a delivery."""
    path = tmp_path / "epoch.json"
    with asyncloader.trace(path):
        loader = AsyncLoader(dataset(), batch_size=BATCH, **options)
        got = []
        for batch in loader:
            got.append(batch)
            json.dumps(loader.state_dict())  # a worker's traced answers leave no trace in it
    assert tracing.ACTIVE is None and len(got) == BATCHES
    trace = events(path)
    processes = names_of(trace, "process_name")
    assert sorted(processes.values()) == ["training process"] + [
        f"worker {w}" for w in range(workers)
    ]
    parent = next(pid for pid, name in processes.items() if name == "training process")
    waits = [e for e in trace if e["ph"] == "X" and e["name"].startswith("wait for batch")]
    assert sorted(e["args"]["batch"] for e in waits) == list(range(BATCHES))
    assert all(e["pid"] == parent and e["dur"] >= 0 for e in waits)
    assert {e["name"] for e in waits} == {f"wait for batch {b}" for b in range(BATCHES)}
    stages = Counter(e["name"].split()[0] for e in trace if e["ph"] == "X")
    assert stages["collate"] == stages["share"] == BATCHES
    started = min(e["ts"] for e in waits)
    ended = max(e["ts"] + e["dur"] for e in waits)
    for e in trace:
        if e["ph"] != "M" and e["pid"] != parent:  # a worker's, on the same clock
            assert started - 5e6 < e["ts"] <= ended, e
    starts = Counter(e["id"] for e in trace if e["ph"] == "s")
    ends = Counter(e["id"] for e in trace if e["ph"] == "f")
    assert starts == ends == Counter(range(BATCHES))
    if workers:
        assert {e["pid"] for e in trace if e["ph"] == "s"} <= set(processes) - {parent}
    threads = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"MainThread", "asyncloader-loop"} <= threads


def test_counters_skips_and_the_engine_round_trip(tmp_path):
    path = tmp_path / "skips.json"

    class Bad(Slow):
        async def __getitem__(self, i: int) -> torch.Tensor:
            if i % 10 == 3:
                raise KeyError(i)
            return await super().__getitem__(i)

    with asyncloader.trace(path):
        loader = AsyncLoader(
            Bad(), batch_size=BATCH, num_workers=2, on_error="skip", max_skipped=10
        )
        assert sum(len(b) for b in loader) == N - 5
    trace = events(path)
    skips = [e for e in trace if e["ph"] == "i" and e["name"] == "skip"]
    assert sorted(int(e["args"]["index"]) for e in skips) == [3, 13, 23, 33, 43]
    counters = [e for e in trace if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"batches", "samples", "prefetch"}
    assert all(
        set(e["args"]) == {"window", "ahead", "ready"} for e in counters if e["name"] == "batches"
    )
    depths = [
        e["args"]["per worker"]
        for e in sorted(counters, key=lambda e: e["ts"])
        if e["name"] == "prefetch"
    ]
    assert depths[-1] == loader.stats.prefetch  # "auto" may have moved it on the way
    begun = Counter(e["id"] for e in trace if e["ph"] == "b" and e["cat"] == "engine")
    done = Counter(e["id"] for e in trace if e["ph"] == "e" and e["cat"] == "engine")
    assert begun == done == Counter(range(BATCHES))


def test_the_ring_keeps_the_last_events_and_says_how_many_went(tmp_path):
    path = tmp_path / "ring.json"
    with asyncloader.trace(path, capacity=10):
        list(AsyncLoader(Slow(), batch_size=BATCH))
    document = json.loads(path.read_text())
    kept = [e for e in document["traceEvents"] if e["ph"] != "M"]
    assert len(kept) == 10
    other = document["otherData"]
    assert other["dropped"] == other["recorded"] - 10 > 0
    last = [e for e in kept if e["ph"] == "X" and e["name"].startswith("wait")]
    assert last[-1]["name"] == f"wait for batch {BATCHES - 1}"  # the newest are the ones kept


def test_one_trace_at_a_time_and_nothing_recorded_outside(tmp_path):
    with (
        asyncloader.trace(tmp_path / "a.json"),
        pytest.raises(RuntimeError, match="already active"),
        asyncloader.trace(tmp_path / "b.json"),
    ):
        pass
    assert tracing.ACTIVE is None and not (tmp_path / "b.json").exists()
    list(AsyncLoader(Slow(), batch_size=BATCH, num_workers=2))
    assert tracing.ACTIVE is None
    with pytest.raises(ValueError, match="capacity"):
        tracing.Recorder("x", 0)


def test_a_worker_stops_recording_when_the_trace_ends():
    """A worker's recorder lives while requests ask for it; answers carry its events."""
    tracing.worker_recording(True, lambda: "worker 7")
    try:
        with tracing.span("collate", 1):
            pass
        answer = tracing.with_events("batch")
        assert isinstance(answer, tracing.Traced) and answer.result == "batch"
        assert [e[1] for e in answer.events] == ["collate 1"]
        assert answer.processes[os.getpid()] == "worker 7"
        tracing.worker_recording(False, lambda: "worker 7")
        assert tracing.ACTIVE is None and tracing.with_events("batch") == "batch"
    finally:
        tracing.ACTIVE = None


SCRIPT = textwrap.dedent(
    """
    import torch
    from asyncloader import AsyncLoader

    class Data:
        def __len__(self):
            return 32
        def __getitem__(self, i):
            return torch.full((4,), i)

    if __name__ == "__main__":
        assert sum(len(b) for b in AsyncLoader(Data(), batch_size=8, num_workers=1)) == 32
    """
)
