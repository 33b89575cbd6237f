"""torchdata's resume protocol for what users bring: a stateful iterator returned by
``__iter__``, a dataset's own state between epochs, the shuffle RNG without a generator, and
``state_dict()`` right after ``load_state_dict()``."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from asyncloader import AsyncLoader, AsyncLoaderError
from tests.helpers import SyncSource
from tests.helpers.contracts import check_resume, flat
from tests.helpers.sources import CountingIterator


class RandomWalk:
    """An iterator with its own RNG and position, restorable through its own state_dict."""

    def __init__(self, n: int, seed: int, log: list[str]) -> None:
        self.n, self.pos, self.log = n, 0, log
        self.rng = torch.Generator().manual_seed(seed)

    def __iter__(self) -> RandomWalk:
        return self

    def __next__(self) -> torch.Tensor:
        if self.pos >= self.n:
            raise StopIteration
        self.pos += 1
        return torch.randint(0, 1000, (2,), generator=self.rng)

    def state_dict(self) -> dict:
        rng = self.rng.get_state().tolist()
        return {"pos": self.pos, "rng": rng}

    def load_state_dict(self, state: dict) -> None:
        self.log.append("iterator.load_state_dict")
        self.pos = state["pos"]
        self.rng.set_state(torch.tensor(state["rng"], dtype=torch.uint8))


class WalkDataset(IterableDataset):
    """Its ``__iter__`` returns a stateful iterator; the dataset keeps a seed of its own."""

    def __init__(self, n: int = 30) -> None:
        self.n, self.seed, self.log = n, 0, []

    def __iter__(self) -> RandomWalk:
        self.log.append("iter")
        self.seed += 1  # state that __iter__ creates
        return RandomWalk(self.n, self.seed, self.log)

    def state_dict(self) -> dict:
        return {"seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.log.append("dataset.load_state_dict")
        self.seed = state["seed"]


def test_a_stateful_iterator_resumes_exactly_without_replay():
    """Every stop point: the rest equals the uninterrupted epoch's, random draws included,
    and nothing is replayed (no warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_resume(lambda: AsyncLoader(WalkDataset(), batch_size=4), key=flat)


def test_restore_order_is_dataset_then_iter_then_iterator():
    first = AsyncLoader(WalkDataset(), batch_size=4)
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    it.close()
    dataset = WalkDataset()
    second = AsyncLoader(dataset, batch_size=4)
    second.load_state_dict(state)
    list(second)
    assert dataset.log == ["dataset.load_state_dict", "iter", "iterator.load_state_dict"]


def test_state_dict_after_iter_holds_what_iter_created():
    """state_dict() before the first batch already has the state __iter__ made."""
    dataset = WalkDataset()
    loader = AsyncLoader(dataset, batch_size=4)
    it = iter(loader)
    state = loader.state_dict()
    assert state["dataset_state"] == {"seed": 1}
    assert state["fetcher_state"]["dataset_iter_state"]["pos"] == 0
    it.close()


def test_state_dict_right_after_load_state_dict_is_the_loaded_position():
    """A second checkpoint before iterating must not restart the epoch at batch 0."""
    make = lambda: AsyncLoader(SyncSource(40), batch_size=4, shuffle=True)  # noqa: E731
    torch.manual_seed(3)
    full = make()
    it = iter(full)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(full.state_dict()))
    rest = [flat(b) for b in it]
    middle = make()
    middle.load_state_dict(state)
    again = middle.state_dict()
    assert again == state
    last = make()
    last.load_state_dict(json.loads(json.dumps(again)))
    assert [flat(b) for b in last] == rest


class EpochCounter(Dataset):
    """A map-style dataset with a state of its own, changed at the end of every epoch."""

    def __init__(self) -> None:
        self.epochs = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index + 100 * self.epochs

    def state_dict(self) -> dict:
        return {"epochs": self.epochs}

    def load_state_dict(self, state: dict) -> None:
        self.epochs = state["epochs"]


def test_the_datasets_own_state_is_saved_between_epochs():
    dataset = EpochCounter()
    loader = AsyncLoader(dataset, batch_size=4)
    list(loader)
    dataset.epochs += 1  # what a training loop or the dataset does at the end of an epoch
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["dataset_state"] == {"epochs": 1}
    restored = EpochCounter()
    resumed = AsyncLoader(restored, batch_size=4)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[100, 101, 102, 103], [104, 105, 106, 107]]


def test_without_a_generator_epochs_after_a_state_between_epochs_go_on_as_uninterrupted():
    """state_dict() between epochs saves torch's global RNG state the next shuffle draws
    from; loading it sets that state for good (nothing drew from it yet), so the epochs after
    the resume shuffle as the uninterrupted run's do."""
    make = lambda: AsyncLoader(SyncSource(40), batch_size=4, shuffle=True)  # noqa: E731
    torch.manual_seed(5)
    loader = make()
    list(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [[flat(b) for b in loader] for _ in range(2)]
    torch.manual_seed(6)  # the resuming process's RNG differs
    resumed = make()
    resumed.load_state_dict(state)
    assert [[flat(b) for b in resumed] for _ in range(2)] == expected


class SelfIterating(CountingIterator, IterableDataset):
    """Its own iterator: __iter__ resets the position, so its state must be restored after
    iter(), never before."""

    def __init__(self, n: int = 40) -> None:
        super().__init__(n)

    def __iter__(self) -> SelfIterating:
        self.pos = 0
        return self


def test_a_dataset_that_is_its_own_iterator_is_restored_after_iter():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_resume(lambda: AsyncLoader(SelfIterating(), batch_size=4), [0, 3, 9], key=flat)


class LiveState(IterableDataset):
    """Its state_dict returns the live dict it goes on changing, as users' datasets do."""

    def __init__(self) -> None:
        self.state = {"seen": 0}

    def __iter__(self):
        start = self.state["seen"]
        for value in range(start, 40):
            self.state["seen"] = value + 1
            yield value

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state  # kept, and changed by the next pulls


def test_a_state_dict_of_live_objects_is_copied_when_taken():
    """The source is pulled ahead of the consumer: the state kept for a batch must not
    change as later batches are pulled."""
    check_resume(lambda: AsyncLoader(LiveState(), batch_size=4), [1, 4], key=flat)


def test_a_loaded_state_is_not_changed_by_the_source_that_keeps_it():
    """A source may keep the dict it loads and change it as it goes: the same checkpoint
    loaded twice must resume at the same place both times."""
    first = AsyncLoader(LiveState(), batch_size=4)
    it = iter(first)
    next(it)
    state = first.state_dict()
    it.close()
    runs = []
    for _ in range(2):
        resumed = AsyncLoader(LiveState(), batch_size=4)
        resumed.load_state_dict(state)
        runs.append([v for b in resumed for v in b.tolist()])
    assert runs[0] == runs[1] == list(range(4, 40))


def test_a_newer_epoch_takes_over_a_dataset_that_is_its_own_iterator():
    """Two loaders on one object that is its own iterator: the newer epoch restarts it and
    gets every sample once; the older one, pulled ahead, stops with an error instead of
    losing samples silently."""
    dataset = SelfIterating(40)
    older = iter(AsyncLoader(dataset, batch_size=2))
    first = next(older)
    newer = [v for b in AsyncLoader(dataset, batch_size=2) for v in b.tolist()]
    assert newer == list(range(40))
    with pytest.raises(AsyncLoaderError, match="another epoch started iterating the same object"):
        for _ in older:
            pass
    assert first.tolist() == [0, 1]


class HoldsGlobalRng(Dataset):
    """A dataset whose own state is torch's global RNG state (as torchdata's tests write)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> int:
        return index

    def state_dict(self) -> dict:
        return {"rng": torch.get_rng_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))


def test_the_datasets_state_is_restored_before_the_epoch_draws():
    """Restoring the dataset's state after the shuffle drew would rewind the RNG under it:
    the epoch after would repeat the resumed one's order."""
    make = lambda: AsyncLoader(HoldsGlobalRng(), batch_size=1, shuffle=True)  # noqa: E731
    torch.manual_seed(0)
    first = make()
    list(first)
    state = json.loads(json.dumps(first.state_dict()))
    expected = [[int(b) for b in first] for _ in range(2)]
    resumed = make()
    resumed.load_state_dict(state)
    assert [[int(b) for b in resumed] for _ in range(2)] == expected
