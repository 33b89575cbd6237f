"""Drop-in behaviour for DataLoader users: their seeds, their datasets' threading, their batch
types and DataLoader's own signature and attributes."""

from __future__ import annotations

import threading
import typing
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, SequentialSampler

from asyncloader import AsyncLoader
from tests.helpers import NoisySource, RandomAugment, SyncSource, indices_of, sample
from tests.helpers.contracts import check_resume, flat

# -- random augmentations repeat with the same seed -----------------------------------------------


def augmented(num_workers: int, seed: int = 5, **kw) -> AsyncLoader:
    return AsyncLoader(
        NoisySource(48),
        batch_size=4,
        shuffle=True,
        transform=RandomAugment(),
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


@pytest.mark.filterwarnings("ignore:This AsyncLoader will create 3 worker processes")
def test_worker_draws_repeat_for_any_worker_count_and_run():
    """Without seed_per_sample, draws in __getitem__ and transform depend on the batch alone:
    the same for 1, 2 and 3 workers and run after run; another seed draws differently."""
    reference = [flat(b) for b in augmented(2)]
    for num_workers in (2, 1, 3):
        assert [flat(b) for b in augmented(num_workers)] == reference, num_workers
    assert [flat(b) for b in augmented(2, seed=6)] != reference


def test_worker_draws_differ_between_batches_and_epochs():
    """The per-batch seed is not one seed for all: batches and epochs draw differently."""
    loader = augmented(2, persistent_workers=True)
    first, second = ([b["torch"] for b in loader] for _ in range(2))
    assert len({tuple(t.flatten().tolist()) for t in first}) == len(first)
    assert not all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_worker_draws_repeat_after_resume():
    """A resumed epoch's augmentations equal the uninterrupted epoch's, even with another
    worker count (no seed_per_sample)."""
    check_resume(
        lambda **kw: augmented(**kw),
        [0, 3, 11],
        save_with=dict(num_workers=2),
        resume_with=dict(num_workers=1),
    )


class SeedOf(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return torch.initial_seed()


def seed_12345(worker_id: int) -> None:
    torch.manual_seed(12345)


def note_worker(worker_id: int) -> None:
    pass


def test_a_worker_init_fn_that_seeds_takes_over_seeding():
    """As under DataLoader, the seed a worker_init_fn sets is the one __getitem__ sees; a
    worker_init_fn that leaves the RNGs alone keeps per-batch seeds."""
    seeded = AsyncLoader(SeedOf(), batch_size=2, num_workers=2, worker_init_fn=seed_12345)
    assert {int(s) for b in seeded for s in b} == {12345}
    other = AsyncLoader(SeedOf(), batch_size=2, num_workers=2, worker_init_fn=note_worker)
    assert len({int(b[0]) for b in other}) == 4, "one seed per batch"


# -- num_workers=0 calls a sync __getitem__ one at a time -----------------------------------------


class CountingSource(Dataset):
    """Records how many calls of __getitem__ overlap. With ``meet`` set, the first ``meet``
    calls wait for each other (a barrier): they can only pass if they run at once."""

    def __init__(self, n: int, meet: int = 0) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.barrier = threading.Barrier(meet, timeout=10) if meet else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if self.barrier is not None and index < self.barrier.parties:
                self.barrier.wait()
            return sample(index)
        finally:
            with self.lock:
                self.now -= 1


def test_num_workers_0_calls_a_sync_getitem_one_at_a_time():
    source = CountingSource(200)
    loader = AsyncLoader(source, batch_size=4, io_concurrency=64)
    assert indices_of(loader) == list(range(200))
    assert source.most == 1
    assert loader.stats.max_fetching == 1


def test_fetch_threads_opts_into_concurrent_getitem_calls():
    """fetch_threads=4: four calls run at once (they meet at a barrier of 4)."""
    source = CountingSource(40, meet=4)
    loader = AsyncLoader(source, batch_size=2, fetch_threads=4, timeout=20)
    assert indices_of(loader) == list(range(40))
    assert source.most == 4


# -- batches of every type DataLoader returns from workers ---------------------------------------


class NestedSource(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested tensors are a prototype in torch
            return torch.nested.nested_tensor([torch.full((index + 1,), index), torch.ones(2)])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nested_tensors_come_back_from_workers(num_workers):
    batches = list(AsyncLoader(NestedSource(), batch_size=None, num_workers=num_workers))
    assert [b.is_nested for b in batches] == [True] * 6
    for index, batch in enumerate(batches):
        first, second = batch.unbind()
        assert torch.equal(first, torch.full((index + 1,), index))
        assert torch.equal(second, torch.ones(2))


def sparse_rows(samples: list[int]) -> torch.Tensor:
    return torch.eye(len(samples)).to_sparse() * samples[0]


def test_sparse_batches_come_back_from_workers():
    batches = list(AsyncLoader(list(range(8)), batch_size=4, collate_fn=sparse_rows, num_workers=2))
    assert [b.is_sparse for b in batches] == [True, True]
    assert torch.equal(batches[1].to_dense(), torch.eye(4) * 4)


# -- DataLoader's signature, attributes and warnings ---------------------------------------------


def test_dataloader_positional_arguments_mean_what_they_mean_there():
    """DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
    collate_fn, pin_memory, drop_last, ...) positionally."""
    data = list(range(10))
    loader = AsyncLoader(data, 3, False, None, None, 0, lambda b: b, False, True)
    assert loader.batch_size == 3 and loader.drop_last
    assert list(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_dataset_by_keyword():
    assert indices_of(AsyncLoader(dataset=SyncSource(6), batch_size=3)) == list(range(6))


def test_dataloader_keyword_spellings():
    """multiprocessing_context and prefetch_factor are DataLoader's names for mp_context and
    prefetch; prefetch_factor keeps DataLoader's rule that it needs workers."""
    loader = AsyncLoader(SyncSource(8), num_workers=1, multiprocessing_context="spawn",
                         prefetch_factor=3)  # fmt: skip
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert loader.prefetch_factor == 3 and loader.stats.window == 3
    assert AsyncLoader(SyncSource(8)).prefetch_factor is None
    with pytest.raises(ValueError, match="prefetch_factor option could only be specified"):
        AsyncLoader(SyncSource(8), prefetch_factor=2)
    with pytest.raises(TypeError, match="pass one of them"):
        AsyncLoader(SyncSource(8), num_workers=1, prefetch=2, prefetch_factor=2)
    with pytest.raises(TypeError, match="pass one of them"):
        AsyncLoader(SyncSource(8), num_workers=1, mp_context="spawn",
                    multiprocessing_context="spawn")  # fmt: skip
    with pytest.raises(ValueError, match="multiprocessing_context can only be used"):
        AsyncLoader(SyncSource(8), multiprocessing_context="spawn")


@pytest.mark.parametrize(
    "name", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_assigning_a_fixed_attribute_raises_value_error(name):
    loader = AsyncLoader(SyncSource(8), batch_size=2)
    with pytest.raises(ValueError, match=f"{name} attribute should not be set after AsyncLoader"):
        setattr(loader, name, SequentialSampler(range(3)))


def test_dataloader_attributes_are_readable():
    fn = lambda worker_id: None  # noqa: E731
    loader = AsyncLoader(SyncSource(8), num_workers=1, worker_init_fn=fn, timeout=5,
                         pin_memory_device="", in_order=False)  # fmt: skip
    assert loader.worker_init_fn is fn and loader.timeout == 5 and loader.in_order is False
    assert loader.pin_memory is False and loader.pin_memory_device == ""
    assert loader.collate_fn is torch.utils.data.default_collate
    assert loader.persistent_workers is False and loader.multiprocessing_context is None


def mark_init(worker_id):
    import os

    os.environ["ASYNCLOADER_TEST_SET_INIT"] = str(worker_id)


def read_init(samples):
    import os

    return [os.environ.get("ASYNCLOADER_TEST_SET_INIT", "unset") for _ in samples]


def test_worker_init_fn_can_be_set_after_construction_as_dataloaders():
    """As DataLoader's (Lightning's seed_everything(workers=True) sets it): the next epoch's
    workers call the one set; a wrong type raises as in the constructor."""
    loader = AsyncLoader(SyncSource(4), batch_size=2, num_workers=2, collate_fn=read_init)
    assert sorted(x for batch in loader for x in batch) == ["unset"] * 4
    loader.worker_init_fn = mark_init
    assert loader.worker_init_fn is mark_init
    assert sorted(x for batch in loader for x in batch) in (["0", "0", "1", "1"], ["0"] * 4)
    with pytest.raises(TypeError, match="worker_init_fn"):
        loader.worker_init_fn = 3


def test_loader_is_generic_over_its_samples():
    alias = AsyncLoader[int]
    assert typing.get_origin(alias) is AsyncLoader and typing.get_args(alias) == (int,)


def test_more_workers_than_cores_warn_as_dataloader_does(monkeypatch):
    import asyncloader._base.validate as validate

    monkeypatch.setattr(validate, "available_cores", lambda: 2)
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader"):
        AsyncLoader(SyncSource(8), num_workers=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AsyncLoader(SyncSource(8), num_workers=2)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(fetch_threads=0), ValueError, "fetch_threads=0 must be >= 1"),
        (dict(fetch_threads=2.0), TypeError, "fetch_threads must be an int"),
        (dict(pin_memory_device=3), TypeError, "pin_memory_device must be a str"),
        (dict(num_workers=1, prefetch_factor=0), ValueError, "prefetch_factor=0 must be >= 1"),
        (dict(snapshot_every_n_steps=-1), ValueError, "snapshot_every_n_steps=-1 must be >= 0"),
    ],
)
def test_new_arguments_are_checked(kw, error, match):
    with pytest.raises(error, match=match):
        AsyncLoader(SyncSource(8), **kw)


def test_stateful_dataloaders_snapshot_every_n_steps_is_accepted_and_state_stays_exact():
    make = lambda **kw: AsyncLoader(SyncSource(30), batch_size=3, snapshot_every_n_steps=4, **kw)  # noqa: E731
    check_resume(make, [1, 5])


class CountsTo(torch.utils.data.IterableDataset):
    """An IterableDataset that is its own iterator: its __iter__ resets and returns self."""

    def __iter__(self):
        self.pos = 0
        return self

    def __next__(self) -> int:
        if self.pos >= 10:
            raise StopIteration
        self.pos += 1
        return self.pos


@pytest.mark.timeout(20)
def test_a_dataset_that_is_its_own_iterator_is_iterated_once_per_epoch():
    loader = AsyncLoader(CountsTo(), batch_size=4, timeout=10)
    for _ in range(2):
        assert [b.tolist() for b in loader] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


def test_auto_collation_says_whether_batches_are_collated_from_samples():
    """DataLoader's ``_auto_collation``, which code written for DataLoader reads: a batch
    sampler is in use (batch_size or batch_sampler), as opposed to batch_size=None."""
    assert AsyncLoader(SyncSource(8), batch_size=2)._auto_collation is True
    assert AsyncLoader(SyncSource(8), batch_size=None)._auto_collation is False


class LongerThanItsLen(torch.utils.data.IterableDataset):
    """Yields 6 items but reports a length of 4 (a replica not split per worker, say)."""

    def __iter__(self):
        return iter(range(6))

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("batch_size", [None, 1, 2])
def test_an_iterable_longer_than_its_len_warns_once_len_was_asked(batch_size):
    """As DataLoader: no warning unless len(loader) was called before the epoch began; then
    each batch past that length warns, naming the length and what was fetched."""
    unit = "batches" if batch_size == 2 else "samples"
    loader = AsyncLoader(LongerThanItsLen(), batch_size=batch_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == (3 if batch_size == 2 else 6)
    expected = len(loader)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(expected):
            next(it)
    with pytest.warns(UserWarning) as caught:
        rest = list(it)
    assert len(caught) == len(rest) and rest
    message = str(caught[0].message)
    assert "LongerThanItsLen" in message
    assert "was reported to be 4 (when accessing len(AsyncLoader)" in message
    assert f"but {expected + 1} {unit} have been fetched." in message


def test_an_iterator_without_worker_processes_has_none():
    assert iter(AsyncLoader(SyncSource(4)))._workers == []


def next_epoch_first(cls, num_workers):
    """The first batch of the epoch after one left after len(loader) batches, unended."""
    loader = cls(list(range(96)), batch_size=8, shuffle=True, num_workers=num_workers,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    return next(iter(loader)).tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_next_epoch_after_len_batches_without_the_end_is_always_the_same(num_workers):
    """A trainer that stops after len(loader) batches (Lightning, the HF Trainer) never sees
    the end: the next epoch's order is the same every time (RandomSampler draws once more at
    its end, which must not depend on how far the loader's thread got), and with workers it
    is DataLoader's, whose workers' prefetch reached the end (without workers DataLoader's
    sampler never gets there; asyncloader's prefetch always does)."""
    got = [next_epoch_first(AsyncLoader, num_workers) for _ in range(8)]
    assert got == [got[0]] * 8
    if num_workers:
        assert got[0] == next_epoch_first(torch.utils.data.DataLoader, num_workers)
