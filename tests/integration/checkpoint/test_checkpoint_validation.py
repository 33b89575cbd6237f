"""Checkpoint validation: every malformed or tampered state is refused by
``load_state_dict()`` with a ValueError naming the field, the loader keeps the state it had,
a changed dataset length needs ``allow_length_change=True``, a failed ``iter()`` after a load
keeps the loaded state, and the state loads with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset

from asyncloader import AsyncLoader
from asyncloader.sources import ShardedSource
from tests.helpers import shard_set
from tests.helpers.contracts import state_after
from tests.helpers.depth import scaled
from tests.helpers.sources import CountingIterator
from tests.integration.checkpoint.test_state import as_version_3


class Numbers(Dataset):
    """``0 .. n-1`` at once (no latency); ``offset`` is its own state, added to each."""

    def __init__(self, n: int = 40, fail: int = 0) -> None:
        self.n, self.offset, self.fail = n, 0, fail

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index + self.offset

    def state_dict(self) -> dict:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        if self.fail:  # a state store that is down for the first ``fail`` tries
            self.fail -= 1
            raise OSError("the state store is unreachable")
        self.offset = state["offset"]


class Plain(Dataset):
    """Map-style, without a state of its own."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class Counted(IterableDataset):
    """An iterable whose dataset and iterator both keep state (torchdata's protocol)."""

    def __init__(self, n: int = 24) -> None:
        self.n, self.iter_calls = n, 0

    def state_dict(self) -> dict:
        return {"iter_calls": self.iter_calls}

    def load_state_dict(self, state: dict) -> None:
        self.iter_calls = state["iter_calls"]

    def __iter__(self) -> CountingIterator:
        self.iter_calls += 1
        return CountingIterator(self.n)


def shuffled(n: int = 40, dataset: Any = None, **kw: Any) -> AsyncLoader:
    gen = torch.Generator().manual_seed(3)
    return AsyncLoader(dataset or Plain(n), batch_size=4, shuffle=True, generator=gen, **kw)


def batches(loader: Any) -> list:
    return [b.tolist() for b in loader]


def quoted(message: str) -> list[str]:
    """The fields a message names (``'path'``)."""
    return re.findall(r"'([\w.\[\]]+)'", message)


def within(path: str, field: str) -> bool:
    """``path`` is ``field`` or a field inside it."""
    return path == field or path.startswith((field + ".", field + "["))


def refused(loader: AsyncLoader, state: Any, field: str, **kw: Any) -> str:
    """Loads ``state``: it must raise ValueError naming ``field`` (or a field inside it) and
    leave the loader's state as it was."""
    before = loader.state_dict()
    with pytest.raises(ValueError) as info:
        loader.load_state_dict(state, **kw)
    message = str(info.value)
    assert any(within(name, field) for name in quoted(message)), (field, message)
    assert loader.state_dict() == before, "a refused state changed the loader's"
    return message


# -- the cases ------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["next_batch", "rng", "epoch", "delivered_beyond", "version"])
def test_a_state_missing_a_field_is_refused_and_the_loaded_one_is_kept(field):
    """A state without one of its fields is refused at load, naming it; the state loaded
    before stays, and the loader resumes from it exactly."""
    reference = batches(shuffled())
    good = state_after(shuffled(), 3)
    loader = shuffled()
    loader.load_state_dict(good)
    refused(loader, {k: v for k, v in good.items() if k != field}, field)
    assert batches(loader) == reference[3:]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("next_batch", -1),  # hung the reorder buffer
        ("next_batch", 11),  # past the end (10 batches): gave an empty epoch
        ("next_batch", 2**64),
        ("next_batch", True),
        ("epoch", -1),
        ("delivered_beyond", [3]),  # must lie after next_batch
        ("delivered_beyond", [12]),
        ("batch_size", "4"),
    ],
)
def test_a_position_out_of_range_is_refused(field, value):
    good = state_after(shuffled(), 3)
    refused(shuffled(), {**good, field: value}, field)


def test_the_end_of_an_epoch_is_a_position():
    """next_batch equal to the epoch's length (all received, the end not yet seen) loads:
    the resumed epoch has nothing left, the next one follows."""
    first = shuffled()
    reference = [batches(first) for _ in range(2)]
    state = state_after(shuffled(), 10)
    assert state["next_batch"] == 10
    resumed = shuffled()
    resumed.load_state_dict(state)
    assert [batches(resumed) for _ in range(2)] == [[], reference[1]]


def test_a_changed_dataset_length_is_refused_unless_allowed():
    """Without the opt-in, a dataset of another length is refused, naming the field and the
    opt-in. With it, the resumed epoch is the order of the new length drawn from the saved
    RNG state, its first ``next_batch`` batches stepped over; the epochs after are those of
    an uninterrupted run on the new dataset; the state then records the new length."""
    state = state_after(shuffled(40), 3)
    assert state["dataset_len"] == 40
    message = refused(shuffled(44), state, "dataset_len")
    assert "allow_length_change=True" in message and "40" in message and "44" in message
    longer = shuffled(44)
    expected = [batches(longer) for _ in range(2)]
    resumed = shuffled(44)
    resumed.load_state_dict(state, allow_length_change=True)
    assert resumed.state_dict()["dataset_len"] == 44
    assert [batches(resumed) for _ in range(2)] == [expected[0][3:], expected[1]]


def test_allow_length_change_is_a_bool():
    state = state_after(shuffled(40), 0)
    with pytest.raises(TypeError, match="allow_length_change must be a bool"):
        shuffled(44).load_state_dict(state, allow_length_change="yes")


def test_a_state_saved_before_the_length_was_recorded_loads_without_the_check():
    """A version 4 state has no ``dataset_len``: the length is unknown and not checked."""
    state = state_after(shuffled(40), 0)
    old = {k: v for k, v in state.items() if k != "dataset_len"} | {"version": 4}
    shuffled(44).load_state_dict(old)
    refused(shuffled(40), {**old, "version": 5}, "dataset_len")  # required from version 5


def test_distributed_allows_a_length_change_only_at_an_epoch_boundary():
    def at(n: int, world: int) -> AsyncLoader:
        return AsyncLoader(
            list(range(n)), batch_size=2, shuffle=True, distributed=True, rank=0, world_size=world
        )

    first = at(24, 2)
    list(first)
    boundary = first.state_dict()
    refused(at(30, 2), boundary, "dataset_len")
    for world in (2, 3):
        loader = at(30, world)
        loader.load_state_dict(boundary, allow_length_change=True)
        fresh = at(30, world)
        list(fresh)
        assert batches(loader) == batches(fresh)
    mid = state_after(at(24, 2), 1)
    refused(at(30, 3), mid, "distributed.dataset_len", allow_length_change=True)


def test_a_failed_iter_after_a_load_keeps_the_loaded_state():
    """The source's own load_state_dict fails at iter() (twice): each iter() raises the
    user's error, state_dict() is still the loaded state, and the next iter() resumes."""
    first = shuffled(dataset=Numbers(24))
    list(first)
    first.dataset.offset = 100  # the dataset's own state, changed between epochs
    state = first.state_dict()
    expected = batches(first)
    loader = shuffled(dataset=Numbers(24, fail=2))
    loader.load_state_dict(state)
    for _ in range(2):
        with pytest.raises(OSError, match="unreachable"):
            iter(loader)
        assert loader.state_dict() == state
    assert batches(loader) == expected


def test_a_stateful_iterable_that_fails_to_open_resumes_from_the_loaded_position():
    failures = [1]

    class FailsOnce(CountingIterator):
        def load_state_dict(self, state: dict) -> None:
            if failures[0]:
                failures[0] -= 1
                raise OSError("the first try fails")
            super().load_state_dict(state)

    class Stream(IterableDataset):
        def __iter__(self) -> FailsOnce:
            return FailsOnce(20)

    state = state_after(AsyncLoader(Stream(), batch_size=4), 2)
    loader = AsyncLoader(Stream(), batch_size=4)
    loader.load_state_dict(state)
    with pytest.raises(OSError, match="first try"):
        iter(loader)
    assert [x for b in batches(loader) for x in b] == list(range(8, 20))


def test_the_rng_must_be_the_loaders_kind():
    """A state saved with a generator does not load into a loader without one (its order
    would silently come from torch's global RNG), nor the reverse; a truncated RNG state
    is refused at load, not at iter()."""
    with_gen = state_after(shuffled(), 2)
    without = AsyncLoader(Plain(40), batch_size=4, shuffle=True)
    refused(without, with_gen, "rng.kind")
    refused(
        shuffled(), state_after(AsyncLoader(Plain(40), batch_size=4, shuffle=True), 2), "rng.kind"
    )
    cut = {**with_gen, "rng": {**with_gen["rng"], "state": with_gen["rng"]["state"][:64]}}
    refused(shuffled(), cut, "rng.state")


def test_a_dataset_state_for_a_dataset_without_load_state_dict_is_refused():
    state = shuffled(dataset=Numbers(40)).state_dict()  # between epochs: the dataset's state
    assert state["dataset_state"] == {"offset": 0}
    refused(shuffled(dataset=Plain(40)), state, "dataset_state")


def test_workers_iterating_the_source_keep_their_number_between_epochs():
    """fetch_in_workers: each worker's own dataset state carries into the next epoch, so a
    state between epochs does not load with another num_workers (it failed at iter())."""
    first = AsyncLoader(Counted(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    list(first)
    state = first.state_dict()
    other = AsyncLoader(Counted(6), batch_size=4, num_workers=1, fetch_in_workers=True)
    refused(other, state, "_snapshot._worker_snapshots")
    fresh = AsyncLoader(Counted(6), batch_size=4, num_workers=2, fetch_in_workers=True)
    before_any = fresh.state_dict()  # nothing to carry: any number of workers takes it
    other.load_state_dict(before_any)
    assert sorted(x for b in batches(other) for x in b) == list(range(6))


# -- torch.load(weights_only=True) ----------------------------------------------------------


def _shards(tmp_path: Any) -> list[str]:
    paths = []
    for name, data in shard_set(3, [5, 6, 7]).items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    return paths


def _keys(batch: list) -> torch.Tensor:
    return torch.tensor([int(s["__key__"][1:4]) * 100 + int(s["__key__"][5:]) for s in batch])


def _sharded(paths: list[str], **kw: Any) -> AsyncLoader:
    source = ShardedSource(paths, samples_per_shard=[5, 6, 7], seed=1)
    return AsyncLoader(source, batch_size=2, collate_fn=_keys, **kw)


@pytest.mark.parametrize(
    "config", ["map", "map-workers", "iterable", "sharded", "sharded-fetch-in-workers"]
)
def test_the_state_loads_with_weights_only(tmp_path, config):
    """torch.save, then torch.load(weights_only=True): plain data only; the resumed epoch is
    the rest of the uninterrupted one."""
    paths = _shards(tmp_path) if config.startswith("sharded") else []
    make = {
        "map": lambda: shuffled(),
        "map-workers": lambda: shuffled(num_workers=2),
        "iterable": lambda: AsyncLoader(Counted(20), batch_size=4),
        "sharded": lambda: _sharded(paths),
        "sharded-fetch-in-workers": lambda: _sharded(paths, num_workers=2, fetch_in_workers=True),
    }[config]
    reference = batches(make())
    first = make()
    it = iter(first)
    head = [next(it).tolist() for _ in range(3)]
    torch.save({"loader": first.state_dict()}, tmp_path / "checkpoint.pt")
    it.close()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["loader"]
    resumed = make()
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing replayed
        assert head + batches(resumed) == reference


# -- tampering, driven by hypothesis ----------------------------------------------------------

#: Fields holding a source's own state: any value is the source's to judge, so only their
#: removal is tampering here.
USERS = ("dataset_state", "dataset_iter_state", "dataset", "iterator")


def fields(state: Any, path: tuple = ()) -> list[tuple]:
    """Every field's path in ``state`` (dict keys and list indices), not entering USERS."""
    out = []
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in items:
        out.append((*path, key))
        if isinstance(value, dict | list) and key not in USERS:
            out.extend(fields(value, (*path, key)))
    return out


def named(path: tuple) -> str:
    return ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")


#: Values no field may hold: negative or past int64, floats, junk strings, junk containers.
JUNK = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63, max_value=2**80),
    st.floats(allow_nan=False),
    st.text(max_size=8).map(lambda s: "x" + s),
    st.lists(st.text(max_size=3), min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=3).map(lambda s: "x" + s), st.integers(), max_size=2),
)


def tampered(state: dict, path: tuple, value: Any) -> dict:
    """``state`` with the field at ``path`` set to ``value`` (removed for ``DELETE``)."""
    out = copy.deepcopy(state)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


DELETE = object()


def _fetching(**kw: Any) -> AsyncLoader:
    return AsyncLoader(Counted(24), batch_size=4, num_workers=2, fetch_in_workers=True, **kw)


def _ranked(**kw: Any) -> AsyncLoader:
    return AsyncLoader(
        list(range(40)), batch_size=2, shuffle=True, distributed=True, rank=1, world_size=2, **kw
    )


def _in_process(**kw: Any) -> AsyncLoader:
    return AsyncLoader(Counted(24), batch_size=4, **kw)


def _version_3(state: dict) -> dict:
    """A state as version 3 saved it: the source's state in ``source_state``, no length."""
    return as_version_3({k: v for k, v in state.items() if k != "dataset_len"})


#: name: (the loader, the batches before the checkpoint, fields that may be removed (a
#: map-style source's ``_snapshot`` only mirrors StatefulDataLoader's layout and holds
#: nothing, so a state without it, or without its last worker, is one saved with fewer
#: workers), how the saved state is rewritten (``as_version_3``: the layout before 4)).
TAMPERED = {
    "map": (lambda: shuffled(dataset=Numbers(40)), 3, (), None),
    "map-workers": (
        lambda: shuffled(num_workers=2),
        4,
        (("_snapshot",), ("_snapshot", "_worker_snapshots", "worker_1")),
        None,
    ),
    "iterable": (_in_process, 2, (), None),
    "fetch-in-workers": (_fetching, 3, (), None),
    "fetch-in-workers-v3": (_fetching, 3, (), _version_3),
    "distributed": (_ranked, 2, (), None),
}


@pytest.mark.parametrize("config", sorted(TAMPERED))
def test_a_tampered_state_is_refused_naming_the_field_and_the_loader_resumes_as_before(config):
    """One field of a real state removed or set to junk: ValueError naming it (or the field
    holding it), the loaded state unchanged; afterwards the loader resumes exactly."""
    make, k, optional, rewrite = TAMPERED[config]
    reference = batches(make())
    good = state_after(make(), k)
    if rewrite is not None:
        good = rewrite(good)
    loader = make()
    loader.load_state_dict(good)
    paths = [p for p in fields(good) if p not in optional]

    @settings(max_examples=scaled(200), deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(paths), value=st.one_of(st.just(DELETE), JUNK))
    def tamper(path: tuple, value: Any) -> None:
        if value is not DELETE and path[-1] in USERS:
            value = DELETE  # a source's own state is its own to judge
        bad = tampered(good, path, value)
        with pytest.raises(ValueError) as info:
            loader.load_state_dict(bad)
        field, message = named(path), str(info.value)
        names = quoted(message)
        assert any(within(n, field) or within(field, n) for n in names), (field, message)
        assert loader.state_dict() == good

    tamper()
    assert batches(loader) == reference[k:]


def test_a_state_without_its_sources_state_in_any_layout_is_refused():
    """Neither ``dataset_state``/``fetcher_state`` (read in this process) nor ``_snapshot``
    (workers iterating their copies): refused, naming ``dataset_state``."""
    state = state_after(_in_process(), 2)
    assert "dataset_state" in state
    bare = {k: v for k, v in state.items() if k not in ("dataset_state", "fetcher_state")}
    refused(_in_process(), bare, "dataset_state")


def test_a_version_3_source_state_of_one_iteration_needs_its_dataset_and_iterator():
    """A version-3 ``source_state`` of one iteration without its ``iterator``: refused."""
    old = _version_3(state_after(_in_process(), 2))
    del old["source_state"]["iterator"]
    message = refused(_in_process(), old, "source_state")
    assert "must hold 'dataset' and 'iterator'" in message
