"""fetch_in_workers=True: each worker fetches on its own event loop, and iterates its
own copy of an iterable source, as under DataLoader.

The contracts (order, exactly once, bounded window, clean shutdown, resume, repeatable draws)
run over this placement in tests/integration/test_contracts.py; here are what is particular to it:
where
the fetches run and how many at once, DataLoader's order for an IterableDataset, errors and
crashes inside a worker's loop or iteration, and the states that cannot carry over.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from asyncloader import AsyncLoader
from asyncloader.errors import AsyncLoaderError, WorkerCrashedError
from tests.helpers import CodedError, DieAt, IterSource, SyncSource, indices_of
from tests.helpers.contracts import epoch, state_after, steps
from tests.helpers.sources import EpochCounting, InFlight, RaisingStream, UnevenStream

IN_WORKERS = dict(num_workers=2, fetch_in_workers=True)


def test_fetch_in_workers_needs_workers_and_a_bool():
    with pytest.raises(ValueError, match="fetch_in_workers=True needs num_workers > 0"):
        AsyncLoader(SyncSource(4), fetch_in_workers=True)
    with pytest.raises(TypeError, match="fetch_in_workers"):
        AsyncLoader(SyncSource(4), num_workers=1, fetch_in_workers="yes")


@pytest.mark.parametrize("io_concurrency", [8, 64])
def test_async_fetches_run_in_the_workers_within_their_share(io_concurrency):
    """Every sample is fetched in one of the two workers, never in this process, and no worker
    has more than its half of io_concurrency in flight; the total reaches the limit."""
    source = InFlight(256, gather=io_concurrency // 2)
    loader = AsyncLoader(
        source, batch_size=8, collate_fn=list, io_concurrency=io_concurrency, **IN_WORKERS
    )
    samples = [s for batch in loader for s in batch]
    assert [index for index, _, _ in samples] == list(range(256))
    pids = Counter(pid for _, pid, _ in samples)
    assert len(pids) == 2 and os.getpid() not in pids, pids
    most = {pid: max(n for _, p, n in samples if p == pid) for pid in pids}
    assert all(n <= io_concurrency // 2 for n in most.values()), most
    assert sum(most.values()) > io_concurrency // 2, f"never more than one worker's share: {most}"


def test_a_get_worker_info_sharded_iterable_comes_as_from_dataloader():
    """An IterableDataset that shards itself with torch's get_worker_info(), with parts of
    different lengths: the same batches, in the same order, as DataLoader gives (round robin
    over the workers, one that ended dropping out)."""
    source = UnevenStream([3, 14])
    ours = epoch(AsyncLoader(source, batch_size=4, **IN_WORKERS), key=lambda b: repr(b))
    theirs = epoch(DataLoader(source, batch_size=4, num_workers=2), key=lambda b: repr(b))
    assert ours == theirs
    assert len(ours) == 5


class Whole(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(6))


def test_an_unsharded_iterable_is_iterated_by_every_worker():
    """DataLoader's semantics, duplicates included: each worker iterates its own copy, so a
    source that does not shard itself is yielded once per worker."""
    got = [int(x) for batch in AsyncLoader(Whole(), batch_size=3, **IN_WORKERS) for x in batch]
    assert got == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_error_in_a_workers_iteration_keeps_its_type_and_names_the_worker(mode):
    """A worker's iterator raising: that step raises the user's exception (type, attributes,
    the worker's traceback, a note naming the worker), the other worker's batches still come,
    and the epoch ends once both iterations ended."""
    loader = AsyncLoader(RaisingStream(), batch_size=2, **IN_WORKERS)
    got, errors = steps(loader, mode, key=lambda b: b.tolist())
    assert got == [[0, 1], [0, 1]]
    assert [type(e) for e in errors] == [CodedError, CodedError]
    assert all(e.code == 7 for e in errors)
    notes = ["\n".join(e.__notes__) for e in errors]
    assert "worker=0" in notes[0] and "worker=1" in notes[1], notes
    assert "raise CodedError" in str(errors[0].__cause__), "the worker's traceback"


class Broken:
    def __len__(self):
        return 8

    async def __getitem__(self, index):
        if index == 5:
            raise CodedError("no such object", code=404)
        return index


def test_a_fetch_error_names_stage_batch_and_index():
    """An async __getitem__ raising in a worker: the user's type, with stage, batch, index."""
    got, errors = steps(AsyncLoader(Broken(), batch_size=4, **IN_WORKERS))
    assert [b.tolist() for b in got] == [[0, 1, 2, 3]]
    assert len(errors) == 1 and errors[0].code == 404
    assert "stage=fetch batch=1 index=5" in "\n".join(errors[0].__notes__)


def test_a_dead_worker_is_reported_with_the_batches_it_held():
    """A worker killed mid-epoch (SIGKILL): WorkerCrashedError names its pid, the signal and
    the batches it held; no process is left."""
    with tempfile.TemporaryDirectory() as folder:
        marker = str(Path(folder) / "died")
        loader = AsyncLoader(
            SyncSource(64), batch_size=4, transform=DieAt(21, "sigkill", marker), **IN_WORKERS
        )
        with pytest.raises(WorkerCrashedError) as caught:
            epoch(loader)
    message = str(caught.value)
    assert "is killed by signal: Killed (SIGKILL)" in message
    assert "batch 5 (indices [20, 21, 22, 23])" in message


def test_persistent_workers_iterate_afresh_every_epoch():
    loader = AsyncLoader(IterSource(10), batch_size=3, persistent_workers=True, **IN_WORKERS)
    try:
        for _ in range(2):
            assert sorted(indices_of(loader)) == list(range(10))
    finally:
        loader.close()


def broken_init(worker_id: int) -> None:
    raise CodedError("no GPU for this worker", code=worker_id + 100)


def test_a_worker_init_fn_error_reaches_the_first_step():
    loader = AsyncLoader(IterSource(8), batch_size=2, worker_init_fn=broken_init, **IN_WORKERS)
    with pytest.raises(CodedError) as caught:
        next(iter(loader))
    assert caught.value.code in (100, 101)
    loader.close()


def test_a_position_in_the_workers_iterations_needs_the_same_placement_and_workers():
    """The position of an iterable source iterated by 2 workers means nothing to 3 workers or
    to a single iteration in this process: loading it says so (and the reverse)."""
    state = state_after(AsyncLoader(IterSource(40), batch_size=4, **IN_WORKERS), 3)
    with pytest.raises(ValueError, match="num_workers=2 iterating the source"):
        AsyncLoader(
            IterSource(40), batch_size=4, num_workers=3, fetch_in_workers=True
        ).load_state_dict(state)
    with pytest.raises(ValueError, match="fetch_in_workers=True, this loader has"):
        AsyncLoader(IterSource(40), batch_size=4, num_workers=2).load_state_dict(state)
    single = state_after(AsyncLoader(IterSource(40), batch_size=4), 3)
    with pytest.raises(ValueError, match="fetch_in_workers=False, this loader has"):
        AsyncLoader(IterSource(40), batch_size=4, **IN_WORKERS).load_state_dict(single)


def test_between_epochs_each_workers_dataset_state_carries_over():
    """Persistent workers' copies count their epochs; a state_dict() taken between epochs
    holds each worker's count, so a new loader's next epoch is the one that would have come."""

    def made() -> AsyncLoader:
        source = EpochCounting(10)
        return AsyncLoader(source, batch_size=None, persistent_workers=True, **IN_WORKERS)

    first = made()
    try:
        assert {epoch for _, epoch in epoch_of(first)} == {0}
        state = json.loads(json.dumps(first.state_dict()))
        expected = epoch_of(first)
        assert {epoch for _, epoch in expected} == {1}
    finally:
        first.close()
    second = made()
    try:
        second.load_state_dict(state)
        assert epoch_of(second) == expected
    finally:
        second.close()


def epoch_of(loader: AsyncLoader) -> list[tuple[int, int]]:
    return [(int(i), int(e)) for i, e in loader]


def _core(restarted: bool):
    from asyncloader._engines.fetching_workers import worker_config
    from asyncloader._worker.loop import WorkerCore
    from asyncloader._worker.plan import BatchPlan

    options = AsyncLoader(IterSource(12), batch_size=4, **IN_WORKERS)._options
    return WorkerCore(BatchPlan.of(options), worker_config(options, 8), 0, restarted)


def test_a_workers_iteration_serves_requests_by_number_whatever_their_arrival():
    """Ray may start an async actor's calls out of order: batch 1 asked before batch 0 still
    gets the second batch of the iteration, and batch 0 the first."""
    import asyncio

    from asyncloader._worker.protocol import StreamOpen

    async def run():
        core = _core(restarted=False)
        opening = StreamOpen(token=1, seed=0, delivered=0, state=None)
        # gather starts its tasks in order: the request for batch 1 arrives first.
        second, first = await asyncio.gather(
            core.next_stream(opening, 1), core.next_stream(opening, 0)
        )
        await core.aclose()
        return first, second

    first, second = asyncio.run(run())
    assert (list(first[0]), indices_of([first[1]])) == ([0, 1, 2, 3], [0, 1, 2, 3])
    assert (list(second[0]), indices_of([second[1]])) == ([4, 5, 6, 7], [4, 5, 6, 7])


def test_a_restarted_worker_says_it_lost_the_iteration_it_is_asked_to_continue():
    import asyncio

    from asyncloader._worker.protocol import LOST, StreamOpen

    async def run():
        core = _core(restarted=True)
        answer = await core.next_stream(StreamOpen(1, 0, delivered=2, state=None), 3)
        await core.aclose()
        return answer

    assert asyncio.run(run()) == LOST


def test_a_newer_epoch_takes_over_persistent_workers_iteration():
    """Persistent workers iterate one epoch at a time (as DataLoader's): a new epoch begun
    while an older one is unfinished gets every sample, and the older one says it was
    superseded instead of hanging or yielding a mix."""
    loader = AsyncLoader(IterSource(40), batch_size=2, persistent_workers=True, **IN_WORKERS)
    try:
        old = iter(loader)
        next(old), next(old)
        assert sorted(indices_of(loader)) == list(range(40))
        with pytest.raises(AsyncLoaderError, match="newer epoch of this loader took over"):
            for _ in old:
                pass
    finally:
        loader.close()


def test_a_worker_dying_in_its_own_iteration_raises_worker_crashed_error():
    with tempfile.TemporaryDirectory() as folder:
        die = DieAt(9, "sigkill", str(Path(folder) / "died"))
        loader = AsyncLoader(IterSource(40), batch_size=2, transform=die, **IN_WORKERS)
        with pytest.raises(WorkerCrashedError, match=r"is killed by signal: Killed \(SIGKILL\)"):
            epoch(loader)


class GatedSecondWorker(torch.utils.data.IterableDataset):
    """Worker 0 yields 0..7; worker 1 yields 100..107, its first item only once ``gate`` (a
    FIFO) is opened for writing: a worker held up by its storage."""

    def __init__(self, gate: str) -> None:
        self.gate = gate

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        return self._held() if info.id == 1 else iter(range(8))

    def _held(self):
        os.close(os.open(self.gate, os.O_RDONLY))  # blocks until a writer opens it
        yield from range(100, 108)


@pytest.mark.timeout(60)
def test_out_of_order_takes_whichever_workers_batch_is_ready(tmp_path):
    """in_order=False: a worker held up does not hold up the others (DataLoader's
    in_order=False); each worker's own batches stay in its order, every batch comes once,
    and the state, per worker, resumes exactly."""
    gate = str(tmp_path / "gate")
    os.mkfifo(gate)
    loader = AsyncLoader(GatedSecondWorker(gate), batch_size=2, in_order=False, timeout=30,
                         **IN_WORKERS)  # fmt: skip
    it = iter(loader)
    first = [next(it).tolist() for _ in range(4)]  # worker 1 is held: all of worker 0's
    assert first == [[0, 1], [2, 3], [4, 5], [6, 7]]
    state = json.loads(json.dumps(loader.state_dict()))
    workers = state["_snapshot"]["_worker_snapshots"]
    assert workers["worker_0"]["delivered"] == 4 and workers["worker_1"]["delivered"] == 0
    os.close(os.open(gate, os.O_WRONLY))
    assert [b.tolist() for b in it] == [[100, 101], [102, 103], [104, 105], [106, 107]]
    resumed = AsyncLoader(GatedSecondWorker(gate), batch_size=2, timeout=30, **IN_WORKERS)
    resumed.load_state_dict(state)
    it = iter(resumed)
    os.close(os.open(gate, os.O_WRONLY))
    assert [b.tolist() for b in it] == [[100, 101], [102, 103], [104, 105], [106, 107]]
