"""Checkpoint and resume: state_dict() mid-epoch, load_state_dict() in a new loader."""

import json
import warnings

import pytest
import torch
from torch.utils.data import DistributedSampler

from asyncloader import AsyncLoader
from tests.helpers import (
    AsyncSource,
    NoisySource,
    PlainStream,
    RandomAugment,
    StatefulStream,
    SyncSource,
    indices_of,
)
from tests.helpers.contracts import check_resume, flat
from tests.helpers.sources import CountingIterator


def shuffled(source, **kw):
    def make(**override):
        opts = dict(batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1), **kw)
        opts.update(override)
        return AsyncLoader(source, **opts)

    return make


def test_resume_may_change_workers_and_io_concurrency():
    """num_workers and io_concurrency may differ between the saving and resuming loaders."""
    check_resume(
        shuffled(SyncSource(50)),
        [5],
        save_with=dict(num_workers=2, io_concurrency=4),
        resume_with=dict(num_workers=0, io_concurrency=64),
    )


def test_augmentations_match_after_resume_with_seed_per_sample():
    """With seed_per_sample, the resumed batches' random augmentations match too."""
    make = shuffled(NoisySource(40), transform=RandomAugment(), seed_per_sample=True)
    check_resume(make, [3], save_with=dict(num_workers=2), resume_with=dict(num_workers=1))


def test_out_of_order_resume_redelivers_exactly_the_missing_batches():
    """in_order=False: state names the delivered seqs; resume delivers only the others."""
    check_resume(shuffled(AsyncSource(60), in_order=False), [2, 7], in_order=False)


def test_resume_without_a_generator_uses_the_global_rng_state():
    """No generator: the epoch's starting global RNG state is replayed, and yours is kept."""
    torch.manual_seed(11)
    make = lambda: AsyncLoader(SyncSource(40), batch_size=4, shuffle=True)  # noqa: E731
    full = make()
    it = iter(full)
    for _ in range(3):
        next(it)
    state = full.state_dict()
    rest_same_run = [flat(b) for b in it]
    torch.manual_seed(99)  # the trainer's RNG moved on; resume must not depend on it
    trainer_rng = torch.get_rng_state()
    resumed = make()
    resumed.load_state_dict(state)
    assert [flat(b) for b in resumed] == rest_same_run
    assert torch.equal(torch.get_rng_state(), trainer_rng), "the trainer's RNG is left alone"


def test_a_stateful_stream_resumes_batch_for_batch():
    """A stream with state_dict() restores its own position, a short last batch included."""
    make = lambda **kw: AsyncLoader(StatefulStream(30), batch_size=4, **kw)  # noqa: E731
    check_resume(make, [0, 3, 7, 8])


def test_stateful_stream_is_not_replayed():
    """With state_dict()/load_state_dict() the source restarts at the saved position."""
    stream = StatefulStream(40)
    loader = AsyncLoader(stream, batch_size=4)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    it.close()
    assert state["dataset_state"] == {"pos": 20}
    assert state["fetcher_state"] == {"dataset_iter_state": None}
    resumed_stream = StatefulStream(40)
    resumed = AsyncLoader(resumed_stream, batch_size=4)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fast-forward warning
        assert indices_of(resumed) == list(range(20, 40))


def test_stateless_stream_warns_that_it_fast_forwards():
    """A source without state is replayed from the start, with a warning saying so."""
    loader = AsyncLoader(PlainStream(20), batch_size=4)
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    it.close()
    resumed = AsyncLoader(PlainStream(20), batch_size=4)
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="pulling and dropping 2 batches"):
        rest = iter(resumed)  # the iterator __iter__ returns may keep state: known here
    assert indices_of(rest) == list(range(8, 20))


def test_state_between_epochs_starts_the_next_epoch():
    """A state saved after an epoch ends resumes into the next epoch, as uninterrupted."""
    a = shuffled(SyncSource(20))()
    list(a)
    state = a.state_dict()
    second_epoch = [flat(b) for b in a]
    b = shuffled(SyncSource(20))()
    b.load_state_dict(state)
    assert [flat(x) for x in b] == second_epoch
    assert state["epoch"] == 1 and state["next_batch"] == 0


def test_state_is_small_and_json_friendly():
    """The state is a plain dict that JSON round-trips, a few KB however large the epoch."""
    loader = shuffled(SyncSource(100_000))()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    assert json.loads(json.dumps(state)) == state
    assert len(json.dumps(state)) < 10_000
    assert state["next_batch"] == 1 and state["delivered_beyond"] == []


def test_changing_batch_size_or_world_size_is_refused():
    """A different batch size or DistributedSampler world size fails with a clear error."""
    state = shuffled(SyncSource(20))().state_dict()
    with pytest.raises(ValueError, match="saved with batch_size=4, this loader has batch_size=5"):
        AsyncLoader(SyncSource(20), batch_size=5).load_state_dict(state)
    ds = SyncSource(20)
    two = AsyncLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    three = AsyncLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=3, rank=0))
    with pytest.raises(ValueError, match="num_replicas=2, this loader has num_replicas=3"):
        three.load_state_dict(two.state_dict())
    with pytest.raises(TypeError, match="state must be a dict"):
        two.load_state_dict([])


PREEMPTED = """
import json, os, sys
import torch
from asyncloader import AsyncLoader
from tests.helpers import SyncSource

folder, every, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
loader = AsyncLoader(SyncSource(200), batch_size=4, shuffle=True, num_workers=2,
                     generator=torch.Generator().manual_seed(0))
saved = sorted(int(name.split(".")[0]) for name in os.listdir(folder) if name[0].isdigit())
if mode == "resume":
    with open(os.path.join(folder, f"{saved[-1]}.json")) as f:
        loader.load_state_dict(json.load(f)["loader"])
since = []
for k, batch in enumerate(loader, 1):
    since += batch[:, 0].tolist()
    if mode == "train" and k % every == 0:
        # One file per checkpoint, written whole then renamed: a kill never leaves half of one.
        # A trainer would save its model in the same file.
        path = os.path.join(folder, f"{k}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"loader": loader.state_dict(), "delivered": since}, f)
        os.replace(path + ".tmp", path)
        since = []
        print("checkpoint", flush=True)
if mode == "resume":
    with open(os.path.join(folder, "resumed.json"), "w") as f:
        json.dump({"delivered": since}, f)
"""


# -- StatefulDataLoader's places for a source's own state -----------------------------------------


class CountedIter:
    """An iterable whose iterator keeps its own state, and which counts its __iter__ calls in
    its own state (as torchdata's tests do)."""

    def __init__(self, n: int = 24) -> None:
        self.n, self.iter_calls = n, 0

    def state_dict(self) -> dict:
        return {"iter_calls": self.iter_calls}

    def load_state_dict(self, state: dict) -> None:
        pass  # the count is this copy's own

    def __iter__(self):
        self.iter_calls += 1
        return CountingIterator(self.n)


def test_a_source_state_sits_where_stateful_dataloader_puts_it_without_workers():
    """Without workers: ``dataset_state`` and ``fetcher_state.dataset_iter_state`` at the top."""
    loader = AsyncLoader(CountedIter(), batch_size=4)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    assert state["dataset_state"] == {"iter_calls": 1}
    assert state["fetcher_state"] == {"dataset_iter_state": {"pos": 4}}
    assert "_snapshot" not in state and "source_state" not in state


def test_a_source_state_sits_in_each_workers_snapshot_when_the_workers_iterate():
    """fetch_in_workers: per worker ``_snapshot._worker_snapshots.worker_<i>`` with its
    ``dataset_state`` and ``fetcher_state`` (``dataset_iter_state``, ``fetcher_ended``), and
    nothing at the top (the training process iterates nothing)."""
    loader = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    it = iter(loader)
    next(it)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    assert "dataset_state" not in state and "fetcher_state" not in state
    workers = state["_snapshot"]["_worker_snapshots"]
    assert sorted(workers) == ["worker_0", "worker_1"]
    for i, worker in enumerate(workers[f"worker_{i}"] for i in range(2)):
        assert worker["worker_id"] == i and worker["delivered"] == 1
        assert worker["dataset_state"] == {"iter_calls": 1}
        assert worker["fetcher_state"] == {"dataset_iter_state": {"pos": 4}, "fetcher_ended": False}


def test_every_worker_has_a_snapshot_before_the_first_epoch():
    """As StatefulDataLoader: one entry per worker whatever the source, before any iter();
    the workers of a map-style source hold no state of their own."""
    state = AsyncLoader(SyncSource(8), batch_size=2, num_workers=2).state_dict()
    workers = state["_snapshot"]["_worker_snapshots"]
    assert [workers[f"worker_{i}"]["worker_id"] for i in range(2)] == [0, 1]
    assert all(w["dataset_state"] is None and w["fetcher_state"] is None for w in workers.values())


def as_version_3(state: dict) -> dict:
    """A state in the layout asyncloader saved before version 4 (``source_state``)."""
    moved = ("dataset_state", "fetcher_state", "_snapshot")
    old = {k: v for k, v in state.items() if k not in moved}
    if "dataset_state" in state:
        fetcher = state["fetcher_state"] or {}
        own = {"dataset": state["dataset_state"], "iterator": fetcher.get("dataset_iter_state")}
        old["source_state"] = own
    elif "_snapshot" in state:
        snapshots = state["_snapshot"]["_worker_snapshots"]
        workers = [snapshots[f"worker_{i}"] for i in range(len(snapshots))]
        per_worker = []
        for w in workers:
            fetcher = w["fetcher_state"]
            own = {"dataset": w["dataset_state"], "iterator": fetcher["dataset_iter_state"]}
            per_worker.append(
                {"delivered": w["delivered"], "ended": fetcher["fetcher_ended"], "state": own}
            )
        old["source_state"] = {"per_worker": per_worker, "next": state["_snapshot"]["next_worker"]}
    return {**old, "version": 3}


@pytest.mark.parametrize("workers", [dict(), dict(num_workers=2, fetch_in_workers=True)])
def test_a_version_3_state_still_resumes(workers):
    """States saved before the layout moved (version 3, ``source_state``) load as before."""
    make = lambda: AsyncLoader(CountedIter(20), batch_size=3, **workers)  # noqa: E731
    reference = [b.tolist() for b in make()]
    first = make()
    it = iter(first)
    seen = [next(it).tolist() for _ in range(3)]
    state = as_version_3(first.state_dict())
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert seen + [b.tolist() for b in resumed] == reference


def test_state_dict_right_after_iter_holds_what_each_workers_iter_made():
    """fetch_in_workers, as without workers: state_dict() right after iter() holds each
    worker's state after its own __iter__ (it waits for the workers to open their
    iterations), and resuming from it calls __iter__ once per worker again."""
    loader = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    it = iter(loader)
    state = loader.state_dict()
    workers = state["_snapshot"]["_worker_snapshots"]
    assert [workers[f"worker_{i}"]["dataset_state"] for i in range(2)] == [{"iter_calls": 1}] * 2
    assert [w["fetcher_state"]["dataset_iter_state"] for w in workers.values()] == [{"pos": 0}] * 2
    assert [b.tolist() for b in it] == [[0, 1, 2, 3]] * 2 + [[4, 5]] * 2
    resumed = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    resumed.load_state_dict(state)
    it = iter(resumed)
    again = resumed.state_dict()["_snapshot"]["_worker_snapshots"]
    assert [w["dataset_state"] for w in again.values()] == [{"iter_calls": 1}] * 2
    assert [b.tolist() for b in it] == [[0, 1, 2, 3]] * 2 + [[4, 5]] * 2


@pytest.mark.asyncio
async def test_state_dict_on_the_epochs_own_loop_does_not_wait_for_the_workers():
    """In an async trainer the epoch runs on the trainer's loop: state_dict() there returns
    at once (waiting would stall the loop the workers' answers arrive on)."""
    loader = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    async with loader:
        batches = aiter(loader)
        assert loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["delivered"] == 0
        first = await anext(batches)
        assert first.tolist() == [0, 1, 2, 3]
        assert loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["delivered"] == 1
        await batches.aclose()


@pytest.mark.timeout(20)
def test_state_dict_after_an_epoch_closed_at_once_does_not_wait():
    """An epoch closed before it started opens nothing: state_dict() returns at once (it
    would otherwise wait for workers that never open)."""
    loader = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True,
                         timeout=15)  # fmt: skip
    for _ in range(5):
        it = iter(loader)
        it.close()
        assert loader.state_dict()["next_batch"] == 0


def test_iter_returns_once_the_workers_opened_their_iterations():
    """As StatefulDataLoader's: with workers iterating the source, iter() returns once each
    has opened its iteration, so the state holds what their __iter__ made even when the
    iterator is dropped at once (which stops the epoch)."""
    loader = AsyncLoader(CountedIter(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    iter(loader)
    workers = loader.state_dict()["_snapshot"]["_worker_snapshots"]
    assert [w["dataset_state"] for w in workers.values()] == [{"iter_calls": 1}] * 2


def test_a_source_state_is_copied_whole_and_apart_from_the_source():
    """What the loader keeps of a source's state after each batch equals a deep copy, shares
    no mutable part with the state the source returned (the source goes on changing it), and
    leaves what is not JSON-like to ``copy.deepcopy``."""
    import copy

    import numpy as np

    from asyncloader._base.source_state import copied

    class Opaque:
        def __init__(self) -> None:
            self.items = [1, 2]

    state = {
        "carry": list(range(100)),
        "nested": {"history": [[1, 2], (3, "a")], "none": None, "flag": True},
        "pair": (1.5, "x"),
        "array": np.arange(3),
        "other": Opaque(),
    }
    got = copied(state)
    assert got.keys() == state.keys() and got["carry"] == state["carry"]
    assert got["nested"] == copy.deepcopy(state["nested"]) and got["pair"] == (1.5, "x")
    state["carry"].append(-1)
    state["nested"]["history"][0].append(-1)
    state["array"][0] = 7
    state["other"].items.append(3)
    assert got["carry"] == list(range(100)) and got["nested"]["history"][0] == [1, 2]
    assert got["array"].tolist() == [0, 1, 2] and got["other"].items == [1, 2]
