"""on_error="skip": bad samples leave their batch, are counted and logged, within a budget."""

import asyncio
import logging

import pytest
import torch

from asyncloader import AsyncLoader
from tests.helpers.contracts import steps

BAD = {3, 9, 10, 22}


class BadMap:
    """Sample ``i`` is ``i``; the indices in ``bad`` raise ValueError."""

    def __init__(self, n, bad=()):
        self.n, self.bad = n, set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"cannot read {i}")
        return i


class AsyncBadMap(BadMap):
    """BadMap with ``async def __getitem__``; sample ``i`` takes ``i % 3`` turns of the event
    loop, so that fetches finish out of order (without waiting on the clock)."""

    async def __getitem__(self, i):
        for _ in range(i % 3):
            await asyncio.sleep(0)
        return BadMap.__getitem__(self, i)


class BadTransform:
    """Passes samples through; the samples in ``bad`` raise KeyError."""

    def __init__(self, bad):
        self.bad = set(bad)

    def __call__(self, x):
        if x in self.bad:
            raise KeyError(f"cannot transform {x}")
        return x


class Stream:
    """An iterable source of ``0 .. n-1``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def plain_batch(batch):
    """A batch as a list, checking that it is a plain tensor (no marker, no wrapper)."""
    assert isinstance(batch, torch.Tensor), f"not a plain batch: {batch!r}"
    return batch.tolist()


def batches(loader, mode="sync"):
    """One epoch as ``(batches, errors)``: each step's batch or exception, the epoch going on."""
    return steps(loader, mode, plain_batch)


def make(stage, source, n=24, bad=BAD, **kwargs):
    """A loader whose samples in ``bad`` fail at ``stage`` (fetch or transform)."""
    cls = AsyncBadMap if source == "async" else BadMap
    if stage == "fetch":
        return AsyncLoader(cls(n, bad), batch_size=4, **kwargs)
    return AsyncLoader(cls(n), batch_size=4, transform=BadTransform(bad), **kwargs)


def skipped_indices(caplog):
    return sorted(r.args[0] for r in caplog.records if r.name == "asyncloader")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("source", ["sync", "async"])
@pytest.mark.parametrize("stage", ["fetch", "transform"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_samples_leave_their_batch(caplog, mode, source, stage, num_workers):
    """Every good sample comes once, in order, in shrunk batches; each skip counted and logged."""
    caplog.set_level(logging.WARNING, logger="asyncloader")
    loader = make(stage, source, num_workers=num_workers, on_error="skip", max_skipped=10)
    with loader:
        got, errors = batches(loader, mode)
    assert not errors
    assert got == [
        [0, 1, 2],
        [4, 5, 6, 7],
        [8, 11],
        [12, 13, 14, 15],
        [16, 17, 18, 19],
        [20, 21, 23],
    ]
    assert loader.stats.skipped == len(BAD)
    assert [index for index, _ in loader.skip_log] == sorted(BAD)
    assert skipped_indices(caplog) == sorted(BAD)
    kind = "ValueError" if stage == "fetch" else "KeyError"
    message = next(r.getMessage() for r in caplog.records if r.args[0] == 9)
    assert f"index=9 of batch 2 at stage={stage}" in message and kind in message
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "asyncloader")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_budget_spent_fails_the_batch_and_the_epoch_goes_on(num_workers):
    """Past max_skipped, a bad sample raises its own exception with a note; later batches come."""
    loader = make("fetch", "sync", num_workers=num_workers, on_error="skip", max_skipped=2)
    got, errors = batches(loader)
    assert [type(e) for e in errors] == [ValueError, ValueError]
    assert "cannot read 10" in str(errors[0]) and "cannot read 22" in str(errors[1])
    for exc in errors:
        assert any("max_skipped=2 is spent" in note for note in exc.__notes__)
    # 3 and 9 were skipped; batch 2 (8-11) and batch 5 (20-23) failed whole.
    assert got == [[0, 1, 2], [4, 5, 6, 7], [12, 13, 14, 15], [16, 17, 18, 19]]
    assert loader.stats.skipped == 2


def test_budget_is_per_epoch():
    """Each epoch may skip max_skipped samples: the same bad data does not fail a later epoch."""
    loader = make("transform", "sync", on_error="skip", max_skipped=len(BAD))
    for _ in range(3):
        got, errors = batches(loader)
        assert not errors and sum(len(b) for b in got) == 24 - len(BAD)
        assert loader.stats.skipped == len(BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_all_bad_batch_is_not_yielded_and_resume_is_exact(num_workers):
    """A batch with no sample left is not yielded, counts as received, and resume goes on after."""
    kwargs = {"num_workers": num_workers, "on_error": "skip", "max_skipped": 8}
    loader = make("fetch", "sync", n=20, bad={4, 5, 6, 7}, **kwargs)
    it = iter(loader)
    first = [next(it).tolist(), next(it).tolist()]
    assert first == [[0, 1, 2, 3], [8, 9, 10, 11]]
    state = loader.state_dict()
    assert state["next_batch"] == 3
    loader.close()
    resumed = make("fetch", "sync", n=20, bad={4, 5, 6, 7}, **kwargs)
    resumed.load_state_dict(state)
    rest, errors = batches(resumed)
    assert not errors and rest == [[12, 13, 14, 15], [16, 17, 18, 19]]


def test_batch_size_none_skips_single_samples():
    """Without batching a bad sample is simply not yielded."""
    loader = AsyncLoader(BadMap(6, {2}), batch_size=None, on_error="skip", max_skipped=1)
    assert [int(x) for x in loader] == [0, 1, 3, 4, 5]


def test_iterable_source_transform_errors_are_skipped():
    """Samples of an iterable source whose transform raises are left out too."""
    loader = AsyncLoader(
        Stream(10), batch_size=4, transform=BadTransform({1, 8}), on_error="skip", max_skipped=5
    )
    got, errors = batches(loader)
    assert not errors and got == [[0, 2, 3], [4, 5, 6, 7], [9]]


def test_collate_errors_are_not_skipped():
    """A collate_fn error fails its batch as with on_error="raise"."""

    def collate(samples):
        if 5 in samples:
            raise RuntimeError("collate broke")
        return torch.tensor(samples)

    loader = AsyncLoader(
        BadMap(12, {1}), batch_size=4, collate_fn=collate, on_error="skip", max_skipped=3
    )
    got, errors = batches(loader)
    assert [str(e) for e in errors] == ["collate broke"]
    assert got == [[0, 2, 3], [8, 9, 10, 11]]
    assert loader.stats.skipped == 1


def test_raise_is_the_default():
    """Without on_error="skip" a bad sample fails its batch and nothing is counted."""
    loader = AsyncLoader(BadMap(8, {1}), batch_size=4)
    got, errors = batches(loader)
    assert [type(e) for e in errors] == [ValueError] and got == [[4, 5, 6, 7]]
    assert loader.stats.skipped == 0 and loader.skip_log == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"on_error": "ignore"}, ValueError, "on_error='ignore' must be 'raise' or 'skip'"),
        ({"on_error": 1}, TypeError, "on_error must be 'raise' or 'skip', got int"),
        ({"on_error": "skip"}, ValueError, "on_error='skip' needs max_skipped=N"),
        ({"on_error": "skip", "max_skipped": 0}, ValueError, "max_skipped=0 must be >= 1"),
        ({"on_error": "skip", "max_skipped": 1.5}, TypeError, "max_skipped must be an int"),
        ({"max_skipped": 3}, ValueError, "max_skipped=3 is only meaningful with on_error='skip'"),
    ],
)
def test_validation_messages(kwargs, error, message):
    """Bad on_error / max_skipped values fail in the constructor with a message naming them."""
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        AsyncLoader(BadMap(4), **kwargs)


def test_device_stage_passes_shrunk_and_empty_batches():
    """With a device stage, shrunk batches are moved and an emptied one is still not yielded."""
    loader = AsyncLoader(
        BadMap(12, {1, 4, 5, 6, 7}), batch_size=4, device="cpu", on_error="skip", max_skipped=5
    )
    got, errors = batches(loader)
    assert not errors and got == [[0, 2, 3], [8, 9, 10, 11]]
    assert loader.stats.skipped == 5
