"""``__getitems__``: a sync map-style source is fetched one call per batch, as under DataLoader,
in every placement; errors, skipping and per-sample seeding keep their contracts."""

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

from asyncloader import AsyncLoader
from tests.helpers import GetitemsSource, add_one
from tests.helpers.contracts import flat, steps

N, BATCH, SEED = 22, 4, 5  # 5 batches and a short one
PLACEMENTS = [
    pytest.param({}, id="workers=0"),
    pytest.param({"fetch_threads": 2}, id="workers=0-threads=2"),
    pytest.param({"num_workers": 2}, id="workers=2"),
    pytest.param({"num_workers": 2, "fetch_in_workers": True}, id="fetch-in-workers"),
    pytest.param(
        {"num_workers": 2, "fetch_in_workers": True, "fetch_threads": 2},
        id="fetch-in-workers-threads=2",
    ),
]
LOOP_AND_WORKERS = [
    pytest.param({}, id="workers=0"),
    pytest.param({"num_workers": 2}, id="workers=2"),
    pytest.param({"num_workers": 2, "fetch_in_workers": True, "fetch_threads": 2}, id="fetching"),
]


def generator(seed=SEED):
    return torch.Generator().manual_seed(seed)


def calls(log):
    """The calls a GetitemsSource logged: ``[(kind, indices), ...]``, in no particular order."""
    with open(log) as f:
        return [(kind, indices) for kind, indices in map(json.loads, f)]


def reference(dataset, **kwargs):
    """DataLoader's epoch over ``dataset``, shuffled from SEED, each batch flattened."""
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=generator(), **kwargs)
    return [flat(batch) for batch in loader]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_one_call_per_batch_with_its_indices(tmp_path, placement):
    """Each batch is one __getitems__ call with exactly its indices (no __getitem__ call), and
    the batches equal DataLoader's with the same generator seed."""
    log = tmp_path / "calls"
    loader = AsyncLoader(
        GetitemsSource(N, str(log)), batch_size=BATCH, shuffle=True, generator=generator(),
        **placement,
    )  # fmt: skip
    with loader:
        got = [flat(batch) for batch in loader]
    assert got == reference(GetitemsSource(N))
    batches = sorted([row[0] for row in batch] for batch in got)
    assert sorted(calls(log)) == [("getitems", indices) for indices in batches]


class ThreadNames(GetitemsSource):
    """Records the name of the thread each ``__getitems__`` call runs on."""

    def __init__(self, n):
        super().__init__(n)
        self.threads = set()

    def __getitems__(self, indices):
        self.threads.add(threading.current_thread().name)
        return super().__getitems__(indices)


@pytest.mark.parametrize(
    "options, where",
    [
        ({}, {"asyncloader-loop"}),
        ({"fetch_threads": 2}, {"asyncloader-fetch"}),
        ({"transform": add_one}, {"asyncloader-loop"}),
    ],
    ids=["one-call-at-a-time", "fetch_threads=2", "transform"],
)
def test_without_workers_a_for_epoch_makes_batches_on_its_own_loop(options, where):
    """A ``for`` epoch without workers makes its batches, one call at a time, on the loader's
    own loop thread (no fetch thread beside it: one GIL hand-over fewer per batch, as
    DataLoader); with more fetch threads, in those; and every batch is still right."""
    dataset = ThreadNames(N)
    with AsyncLoader(
        dataset, batch_size=BATCH, shuffle=True, generator=generator(), **options
    ) as loader:
        got = [flat(batch) for batch in loader]
    shift = 1 if "transform" in options else 0
    assert got == [[[v + shift for v in row] for row in b] for b in reference(GetitemsSource(N))]
    assert {name.rsplit("_", 1)[0] for name in dataset.threads} == where


class WaitsForTheConsumer(GetitemsSource):
    """Batch 1's call waits until the consumer holds batch 0 (at most ``WAIT_S``)."""

    def __init__(self, n):
        super().__init__(n)
        self.consumer_has_batch_0 = threading.Event()
        self.waited_in_vain = False

    def __getitems__(self, indices):
        if indices[0] == BATCH:  # batch 1 (not shuffled)
            self.waited_in_vain = not self.consumer_has_batch_0.wait(WAIT_S)
        return super().__getitems__(indices)


WAIT_S = 5.0


@pytest.mark.timeout(60)
def test_a_batch_made_on_the_loop_reaches_the_consumer_before_the_next_is_made():
    """Made on the loop, batch 0 is handed to the consumer before batch 1's call begins,
    although the window admits both at once: the consumer is never a batch behind."""
    dataset = WaitsForTheConsumer(N)
    with AsyncLoader(dataset, batch_size=BATCH, prefetch=4) as loader:
        got = []
        for batch in loader:
            got.append(flat(batch))
            dataset.consumer_has_batch_0.set()
    assert not dataset.waited_in_vain
    assert [row[0] for batch in got for row in batch] == list(range(N))


class RunsItsOwnLoop(GetitemsSource):
    """Reads a batch with ``asyncio.run()``, as a sync dataset over an async client does, and
    records whether a loop was running when it was called."""

    def __init__(self, n):
        super().__init__(n)
        self.saw_a_running_loop = False

    def __getitems__(self, indices):
        try:
            asyncio.get_running_loop()
            self.saw_a_running_loop = True
        except RuntimeError:
            pass

        async def read():
            await asyncio.sleep(0)
            return [super(RunsItsOwnLoop, self).__getitems__(indices)]

        return asyncio.run(read())[0]


@pytest.mark.parametrize("placement", [{}, {"fetch_threads": 2}], ids=["on-the-loop", "threads"])
def test_a_dataset_may_run_its_own_event_loop(placement):
    """Made on the loader's loop thread, a call still runs as in a plain thread: no running
    loop, so ``asyncio.run()`` works; the loader's loop goes on, a second epoch too."""
    dataset = RunsItsOwnLoop(N)
    theirs = DataLoader(GetitemsSource(N), batch_size=BATCH, shuffle=True, generator=generator())
    with AsyncLoader(
        dataset, batch_size=BATCH, shuffle=True, generator=generator(), **placement
    ) as loader:
        for _ in range(2):
            assert [flat(batch) for batch in loader] == [flat(batch) for batch in theirs]
    assert not dataset.saw_a_running_loop


@pytest.mark.asyncio
async def test_an_async_epoch_never_blocks_the_users_loop_with_a_call():
    """``async for`` runs on the user's loop: its calls stay in a fetch thread, so the loop
    goes on with its own tasks while a batch is made."""
    dataset = ThreadNames(N)
    async with AsyncLoader(dataset, batch_size=BATCH) as loader:
        got = [flat(batch) async for batch in loader]
    assert [row[0] for batch in got for row in batch] == list(range(N))
    assert {name.rsplit("_", 1)[0] for name in dataset.threads} == {"asyncloader-fetch"}


@pytest.mark.parametrize("transform", [None, add_one])
def test_with_an_executor_calls_stay_in_the_fetch_threads(tmp_path, transform):
    """With a user executor (no workers), each batch is still one call, in the loader's fetch
    threads: the executor transforms and collates, the dataset never travels to it."""
    log = tmp_path / "calls"
    with ThreadPoolExecutor(2) as pool:
        loader = AsyncLoader(
            GetitemsSource(N, str(log)), batch_size=BATCH, shuffle=True, generator=generator(),
            executor=pool, transform=transform,
        )  # fmt: skip
        with loader:
            got = [flat(batch) for batch in loader]
    shift = 0 if transform is None else 1
    want = [[[v + shift for v in row] for row in b] for b in reference(GetitemsSource(N))]
    assert got == want
    assert sorted(calls(log)) == sorted(("getitems", [r[0] - shift for r in b]) for b in got)


@pytest.mark.parametrize("placement", LOOP_AND_WORKERS)
def test_transform_sees_each_sample(tmp_path, placement):
    """With a transform, each sample of the call is transformed on its own."""
    log = tmp_path / "calls"
    dataset = GetitemsSource(N, str(log))
    loader = AsyncLoader(dataset, batch_size=BATCH, transform=add_one, **placement)
    with loader:
        got = [flat(batch) for batch in loader]
    assert [row[0] for batch in got for row in batch] == list(range(1, N + 1))
    assert {kind for kind, _ in calls(log)} == {"getitems"}


class Columns:
    """``__getitems__`` returns the batch already collated, a dict of columns: DataLoader
    passes it to collate_fn as it is."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": torch.tensor([i])}

    def __getitems__(self, indices):
        return {"x": torch.tensor(indices)}


def first(batch):
    return batch


@pytest.mark.parametrize("placement", LOOP_AND_WORKERS)
def test_what_getitems_returns_reaches_collate_fn_as_it_is(placement):
    """Without a transform, __getitems__'s result goes to collate_fn untouched, as under
    DataLoader, even when it is not a list of samples."""
    loader = AsyncLoader(Columns(), batch_size=BATCH, collate_fn=first, **placement)
    with loader:
        got = [flat(batch) for batch in loader]
    assert got == [flat(batch) for batch in DataLoader(Columns(), BATCH, collate_fn=first)]


def test_a_transform_needs_one_sample_per_index():
    """With a transform, a result that is not one sample per index fails its batch, saying so."""
    loader = AsyncLoader(Columns(), batch_size=BATCH, collate_fn=first, transform=add_one)
    with loader:
        _, errors = steps(loader)
    assert len(errors) == 6 and all(isinstance(e, ValueError) for e in errors)
    assert "Columns.__getitems__ returned 1 samples for 4 indices" in str(errors[0])
    assert any("stage=fetch batch=0" in note for note in errors[0].__notes__)


def test_batch_size_none_calls_getitem(tmp_path):
    """Without automatic batching (batch_size=None) each index is one __getitem__, as torch."""
    log = tmp_path / "calls"
    with AsyncLoader(GetitemsSource(6, str(log)), batch_size=None) as loader:
        assert [flat(sample) for sample in loader] == [[i] * 3 for i in range(6)]
    assert sorted(calls(log)) == [("getitem", [i]) for i in range(6)]


def test_batch_sampler_batches_are_one_call_each(tmp_path):
    """A batch_sampler batches automatically too: each of its batches is one call, as torch."""
    log = tmp_path / "calls"
    with AsyncLoader(GetitemsSource(6, str(log)), batch_sampler=[[3, 1], [0, 2, 5]]) as loader:
        assert [[row[0] for row in flat(b)] for b in loader] == [[3, 1], [0, 2, 5]]
    assert sorted(calls(log)) == [("getitems", [0, 2, 5]), ("getitems", [3, 1])]


class Disabled(GetitemsSource):
    """A ``__getitems__`` set to None: DataLoader's test for it fails, so neither uses it."""

    __getitems__ = None


def test_getitems_none_is_not_called(tmp_path):
    """A __getitems__ that is None is not used: __getitem__ per index."""
    log = tmp_path / "calls"
    with AsyncLoader(Disabled(8, str(log)), batch_size=BATCH) as loader:
        assert [flat(b) for b in loader] == [flat(b) for b in DataLoader(Disabled(8), BATCH)]
    assert {kind for kind, _ in calls(log)} == {"getitem"}


def test_subset_is_read_through_its_getitems():
    """torch's Subset defines __getitems__: the same batches as DataLoader's."""
    subset = Subset(GetitemsSource(N), list(range(N - 1, -1, -2)))
    with AsyncLoader(subset, batch_size=BATCH, shuffle=True, generator=generator()) as loader:
        assert [flat(b) for b in loader] == reference(subset)


# -- errors ------------------------------------------------------------------------------------


class BadBatch(GetitemsSource):
    """``__getitems__`` raises for a batch holding an index in ``bad``; ``__getitem__`` raises
    for the indices in ``bad_samples`` only."""

    def __init__(self, n, bad=(), bad_samples=(), log=None):
        super().__init__(n, log)
        self.bad, self.bad_samples = set(bad), set(bad_samples)

    def __getitem__(self, index):
        if index in self.bad_samples:
            raise KeyError(f"cannot read {index}")
        return super().__getitem__(index)

    def __getitems__(self, indices):
        if self.bad & set(indices):
            raise OSError(f"cannot read the batch of {indices[0]}")
        return super().__getitems__(indices)


def ids(batch):
    return [int(row[0]) for row in batch]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_error_names_the_batch_and_the_epoch_goes_on(placement):
    """A __getitems__ error fails its batch only, noted with stage=fetch, the batch and its
    indices; the other batches come."""
    loader = AsyncLoader(BadBatch(12, bad={5}), batch_size=BATCH, **placement)
    with loader:
        got, errors = steps(loader, key=ids)
    assert got == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert [type(e) for e in errors] == [OSError] and "batch of 4" in str(errors[0])
    assert "asyncloader: stage=fetch batch=1 indices=[4, 5, 6, 7]" in errors[0].__notes__


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_skip_finds_the_bad_samples_one_by_one(caplog, tmp_path, placement):
    """on_error="skip": a batch whose __getitems__ raises is fetched again sample by sample;
    the samples whose __getitem__ raises are left out, counted and logged, the rest kept."""
    caplog.set_level(logging.WARNING, logger="asyncloader")
    log = tmp_path / "calls"
    source = BadBatch(16, bad={5, 9, 10}, bad_samples={5, 9, 10}, log=str(log))
    loader = AsyncLoader(source, batch_size=BATCH, on_error="skip", max_skipped=3, **placement)
    with loader:
        got, errors = steps(loader, key=ids)
    assert not errors
    assert got == [[0, 1, 2, 3], [4, 6, 7], [8, 11], [12, 13, 14, 15]]
    assert loader.stats.skipped == 3
    assert [index for index, _ in loader.skip_log] == [5, 9, 10]
    message = next(r.getMessage() for r in caplog.records if r.args[0] == 9)
    assert "index=9 of batch 2 at stage=fetch" in message and "KeyError" in message
    singles = sorted(indices[0] for kind, indices in calls(log) if kind == "getitem")
    # __getitem__ ran for the batches whose call raised only (bad samples raise unlogged)
    assert singles == [4, 6, 7, 8, 11]


@pytest.mark.parametrize("placement", LOOP_AND_WORKERS)
def test_skip_fails_a_batch_no_sample_of_which_raises(placement):
    """on_error="skip": when no sample's __getitem__ raises, the __getitems__ error is not a
    sample's: the batch fails with it (as a collate error does), nothing is counted, the
    epoch goes on."""
    loader = AsyncLoader(
        BadBatch(12, bad={5}), batch_size=BATCH, on_error="skip", max_skipped=3, **placement
    )
    with loader:
        got, errors = steps(loader, key=ids)
    assert got == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert [type(e) for e in errors] == [OSError]
    assert any("no sample's __getitem__ raised" in note for note in errors[0].__notes__)
    assert "asyncloader: stage=fetch batch=1 indices=[4, 5, 6, 7]" in errors[0].__notes__
    assert loader.stats.skipped == 0


def test_skip_with_a_transform_keeps_positions():
    """on_error="skip" with a transform: the samples kept are transformed, each its own."""
    source = BadBatch(8, bad={2}, bad_samples={2})
    loader = AsyncLoader(
        source, batch_size=BATCH, transform=add_one, on_error="skip", max_skipped=1
    )
    with loader:
        got, errors = steps(loader, key=ids)
    assert not errors and got == [[1, 2, 4], [5, 6, 7, 8]]


# -- seed_per_sample ----------------------------------------------------------------------------


class Drawing(GetitemsSource):
    """Each sample holds a draw from torch's global RNG, made as it is read."""

    def __getitem__(self, index):
        self._record("getitem", [index])
        return np.array([index, int(torch.randint(1 << 30, ()))])

    def __getitems__(self, indices):
        self._record("getitems", indices)
        return [np.array([i, int(torch.randint(1 << 30, ()))]) for i in indices]


def test_seed_per_sample_calls_getitem_per_sample(tmp_path):
    """seed_per_sample=True: every sample is seeded before it is read, which one call per batch
    cannot honour: each is read by __getitem__, and its draw is the same in any batch, for any
    num_workers."""
    log = tmp_path / "calls"

    def run(batch_size, **kwargs):
        loader = AsyncLoader(
            Drawing(12, str(log)), batch_size=batch_size, shuffle=True, seed_per_sample=True,
            generator=generator(), **kwargs,
        )  # fmt: skip
        with loader:
            return dict(row.tolist() for batch in loader for row in batch)

    draws = run(BATCH)
    assert run(3, num_workers=2) == draws and run(6, num_workers=2, fetch_in_workers=True) == draws
    assert {kind for kind, _ in calls(log)} == {"getitem"}


# -- Hugging Face datasets ----------------------------------------------------------------------


def hf_dataset(n=50):
    datasets = pytest.importorskip("datasets")
    rows = np.arange(n)
    table = {
        "label": rows,
        "x": np.stack([rows, rows * 2]).T.astype(np.float32),
        "name": [f"row{i}" for i in rows],
    }
    return datasets.Dataset.from_dict(table).with_format("torch")


def hf_flat(batch):
    """A batch of dicts (of tensors and a list of strings) as plain values, dtypes included."""
    return {
        k: (str(v.dtype), v.tolist()) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


@pytest.mark.parametrize("placement", LOOP_AND_WORKERS)
def test_hugging_face_dataset_gives_dataloaders_batches(placement):
    """A datasets.Dataset in torch format: the same batches as DataLoader's, dtypes included
    (its __getitems__ returns a list of dicts, which default_collate turns into a dict)."""
    dataset = hf_dataset()
    opts = {"batch_size": 8, "shuffle": True}
    want = [hf_flat(b) for b in DataLoader(dataset, generator=generator(), **opts)]
    with AsyncLoader(dataset, generator=generator(), **opts, **placement) as loader:
        got = [hf_flat(b) for b in loader]
    assert got == want
    assert set(got[0]) == {"label", "x", "name"} and got[0]["x"][0] == "torch.float32"
