"""Argument validation: DataLoader's mistakes raise what DataLoader raises, naming the argument."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from asyncloader import AsyncLoader
from tests.helpers import AsyncSource, IterSource, SyncSource

DS = SyncSource(10)

SHARED_MISTAKES = [
    (DS, dict(sampler=SequentialSampler(DS), shuffle=True), "sampler option is mutually exclusive"),
    (DS, dict(batch_sampler=BatchSampler(range(10), 2, False), batch_size=4), "batch_sampler"),
    (DS, dict(batch_sampler=BatchSampler(range(10), 2, False), drop_last=True), "batch_sampler"),
    (DS, dict(batch_size=None, drop_last=True), "batch_size=None"),
    (DS, dict(num_workers=-1), "num_workers"),
    (DS, dict(timeout=-1), "timeout"),
    (DS, dict(persistent_workers=True), "persistent_workers"),
    (DS, dict(multiprocessing_context="spawn"), "num_workers > 0"),
    (DS, dict(num_workers=2, multiprocessing_context="nope"), "valid start method"),
    (DS, dict(prefetch_factor=2), "prefetch_factor"),
    (IterSource(10), dict(shuffle=True), "shuffle"),
    (IterSource(10), dict(sampler=[0, 1]), "sampler"),
]


@pytest.mark.parametrize(("dataset", "kwargs", "message"), SHARED_MISTAKES)
def test_same_mistake_raises_what_dataloader_raises(dataset, kwargs, message):
    """Each DataLoader mistake raises DataLoader's exception type, with a message naming it."""
    with pytest.raises(Exception) as theirs:
        DataLoader(dataset, **kwargs)
    with pytest.raises(theirs.type, match=message):
        AsyncLoader(dataset, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(prefetch=0), ValueError, "prefetch=0 must be >= 1"),
        (dict(io_concurrency=0), ValueError, "io_concurrency=0 must be >= 1"),
        (dict(io_concurrency=2.5), TypeError, "io_concurrency must be an int"),
        (dict(batch_size=0), ValueError, "batch_size=0 must be >= 1"),
        (dict(transform=3), TypeError, "transform must be callable"),
        (dict(collate_fn="x"), TypeError, "collate_fn must be callable"),
        (dict(executor=object()), TypeError, "executor must be a concurrent.futures.Executor"),
        (dict(generator=1), TypeError, "generator must be a torch.Generator"),
        (dict(device=3), TypeError, "device must be a str or torch.device"),
        (dict(num_workers=2, mp_context="no"), ValueError, "but got multiprocessing_context='no'"),
        (dict(timeout="1"), TypeError, "timeout must be a number"),
    ],
)
def test_own_options_are_checked_in_the_constructor(kwargs, error, message):
    """asyncloader's own options fail eagerly with an exact message naming the argument."""
    with pytest.raises(error, match=message):
        AsyncLoader(DS, **kwargs)


def test_executor_and_num_workers_are_exclusive():
    """Passing both an executor and num_workers is ambiguous and refused."""
    with (
        ThreadPoolExecutor(1) as pool,
        pytest.raises(ValueError, match="executor and num_workers=2 are exclusive"),
    ):
        AsyncLoader(DS, executor=pool, num_workers=2)


def test_dataset_must_be_indexable_or_iterable():
    """A dataset that is neither map-style nor iterable is a TypeError naming its type."""
    with pytest.raises(TypeError, match=r"dataset must be map-style .* got int"):
        AsyncLoader(3)


@pytest.mark.parametrize(
    ("dataset", "kwargs"),
    [
        (SyncSource(10), dict(batch_size=3)),
        (SyncSource(10), dict(batch_size=3, drop_last=True)),
        (SyncSource(10), dict(batch_size=None)),
        (SyncSource(10), dict(batch_sampler=BatchSampler(range(10), 4, False))),
        (IterSource(10), dict(batch_size=3)),
        (IterSource(10), dict(batch_size=3, drop_last=True)),
        (AsyncSource(10), dict(batch_size=4, shuffle=True)),
    ],
)
def test_len_matches_dataloader(dataset, kwargs):
    """len(loader) is the number of batches DataLoader reports for the same arguments."""
    expected = len(DataLoader(dataset if not isinstance(dataset, AsyncSource) else DS, **kwargs))
    assert len(AsyncLoader(dataset, **kwargs)) == expected


def test_device_is_normalised():
    """device accepts a string and exposes a torch.device."""
    loader = AsyncLoader(DS, device="cpu")
    assert loader._options.device == torch.device("cpu")


class Backwards:
    """The sampler of :class:`OwnOrder`: each ``iter()`` reads where the dataset stands."""

    def __init__(self, dataset: "OwnOrder") -> None:
        self.dataset = dataset

    def __iter__(self):
        rank, world = self.dataset.place
        return iter(range(self.dataset.n - 1 - rank, -1, -world))

    def __len__(self) -> int:
        rank, world = self.dataset.place
        return len(range(self.dataset.n - 1 - rank, -1, -world))


class OwnOrder:
    """A map-style dataset that supplies its sampler (``loader_sampler()``): its indices
    backwards, split by rank as it decides (here: every other index from ``rank``)."""

    def __init__(self, n: int) -> None:
        self.n, self.place = n, (0, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index

    def set_rank(self, rank: int, world_size: int) -> None:
        self.place = (rank, world_size)

    def loader_sampler(self) -> Backwards:
        return Backwards(self)


def test_a_dataset_that_supplies_its_sampler_is_read_in_its_order():
    """The loader iterates the dataset's sampler, batched by batch_size and drop_last, in
    place of one of its own (no RandomSampler, no RankSampler with distributed=True: the
    dataset is told its place and splits itself); a stateless one resumes by stepping over
    the batches received."""
    loader = AsyncLoader(OwnOrder(7), batch_size=2, drop_last=True)
    assert [b.tolist() for b in loader] == [[6, 5], [4, 3], [2, 1]] and len(loader) == 3
    ranked = AsyncLoader(OwnOrder(7), batch_size=2, distributed=True, rank=1, world_size=2)
    assert [b.tolist() for b in ranked] == [[5, 3], [1]]
    first = AsyncLoader(OwnOrder(7), batch_size=2)
    it = iter(first)
    next(it)
    state = first.state_dict()
    it.close()
    assert state["dataset_len"] is None  # the dataset's own sampler owns its order
    again = AsyncLoader(OwnOrder(7), batch_size=2)
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == [[4, 3], [2, 1], [0]]


@pytest.mark.parametrize(
    "kwargs",
    [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0, 1]], batch_size=1)],
    ids=["shuffle", "sampler", "batch_sampler"],
)
def test_a_dataset_that_supplies_its_sampler_refuses_the_loaders_sampling(kwargs):
    """Its sampler orders, shuffles and splits it: the loader's own are refused, naming the
    option (shuffle=False is DataLoader's default, and fine)."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name}= with a dataset that supplies its own sampler"):
        AsyncLoader(OwnOrder(4), **kwargs)
    assert [b.tolist() for b in AsyncLoader(OwnOrder(4), batch_size=4, shuffle=False)] == [
        [3, 2, 1, 0]
    ]
