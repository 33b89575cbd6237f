"""SharedList: records pickled into one buffer, read as a sequence, shared with the workers
without the copy-on-read of a list of Python objects."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader import AsyncLoader, SharedList
from tests.helpers.depth import scaled

#: The records of the copy-on-read test: 24,576 of 4 KiB, 96 MiB in all.
RECORD_BYTES = 4096
RECORDS = 24_576


@dataclasses.dataclass
class Box:
    name: str
    values: list[int]


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
records = st.recursive(
    scalars | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=scaled(60), deadline=None)
@given(st.lists(records, max_size=40))
def test_contents_equal_the_records(values):
    """len, every index (negative ones too) and iteration give back the records."""
    shared = SharedList(values)
    assert len(shared) == len(values)
    assert list(shared) == values
    for i in range(-len(values), len(values)):
        assert shared[i] == values[i]


def test_records_of_many_kinds():
    """Arrays, tensors, dataclasses, sets and nested containers come back equal; each read
    is a new object, so changing one leaves the stored record as it was."""
    values = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        torch.arange(5),
        Box("a", [1, 2]),
        {1, 2, 3},
        {"nested": {"deep": [b"\x00\xff", ("t", 1.5)]}},
        "",
        b"",
        None,
    ]
    shared = SharedList(iter(values))  # any iterable, a generator included
    got = list(shared)
    assert np.array_equal(got[0], values[0]) and got[0].dtype == np.float32
    assert torch.equal(got[1], values[1])
    assert got[2:] == values[2:]
    shared[2].values.append(3)
    assert shared[2] == Box("a", [1, 2])


@pytest.mark.parametrize("index", [3, -4, 2**70, -(2**70)])
def test_an_index_out_of_range_raises_as_a_list_does(index):
    values = [0, 1, 2]
    with pytest.raises(IndexError):
        values[index]
    with pytest.raises(IndexError, match="SharedList index out of range"):
        SharedList(values)[index]


@pytest.mark.parametrize("index", ["1", 1.0, None])
def test_an_index_of_another_type_raises_as_a_list_does(index):
    with pytest.raises(TypeError):
        [0, 1][index]
    with pytest.raises(TypeError, match="SharedList indices must be integers or slices"):
        SharedList([0, 1])[index]


def test_integer_like_indices_are_accepted():
    shared = SharedList(["a", "b", "c"])
    assert shared[np.int64(1)] == "b"
    assert shared[torch.tensor(-1)] == "c"


@settings(max_examples=scaled(100), deadline=None)
@given(
    st.integers(0, 12),
    st.none() | st.integers(-15, 15),
    st.none() | st.integers(-15, 15),
    st.none() | st.integers(-4, 4).filter(bool),
    st.none() | st.integers(-4, 4).filter(bool),
)
def test_slices_are_shared_lists_equal_to_the_lists_slices(n, start, stop, step, step2):
    """A slice is a SharedList over the same buffer; a slice of a slice too."""
    values = [f"record {i}" for i in range(n)]
    shared = SharedList(values)
    part = shared[start:stop:step]
    assert isinstance(part, SharedList)
    assert list(part) == values[start:stop:step]
    assert list(part[::step2]) == values[start:stop:step][::step2]
    assert list(pickle.loads(pickle.dumps(part))) == values[start:stop:step]


def test_a_zero_slice_step_raises_as_a_list_does():
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        SharedList([1, 2])[::0]


def test_pickle_and_copies_keep_the_records():
    values = [{"id": i, "text": f"sample {i}"} for i in range(100)]
    shared = SharedList(values)
    for other in (pickle.loads(pickle.dumps(shared)), copy.deepcopy(shared), copy.copy(shared)):
        assert isinstance(other, SharedList)
        assert list(other) == values
    assert list(SharedList([])) == []
    assert list(pickle.loads(ForkingPickler.dumps(SharedList([])))) == []


def test_bad_input_names_the_argument_and_the_record():
    with pytest.raises(TypeError, match="records"):
        SharedList(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"records\[1\]"):
        SharedList([1, lambda: 2, 3])


def test_no_python_object_per_record_is_kept():
    """The records are bytes in one array: building a SharedList of 20,000 dicts leaves a
    handful of tracked objects, not 20,000 (which a fork would copy page by page)."""
    values = [{"id": i} for i in range(20_000)]
    gc.collect()
    before = len(gc.get_objects())
    shared = SharedList(values)
    del values
    gc.collect()
    assert len(gc.get_objects()) - before < 20_000 // 100
    assert shared[-1] == {"id": 19_999}
    assert shared.nbytes >= len(pickle.dumps({"id": 19_999})) * len(shared)


class Records(torch.utils.data.Dataset):
    """A dataset holding its records in a field; item i is (i, len(record i), whether the
    records are in shared memory, the worker's id, and for the first and last items the
    worker's PSS after reading it (else 0))."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        record = self.records[i]
        shared = isinstance(self.records, SharedList) and self.records.is_shared()
        pss = psutil.Process().memory_full_info().pss if i in (0, len(self) - 1) else 0
        return i, len(record), shared, torch.utils.data.get_worker_info().id, pss


def test_a_field_of_a_dataset_under_forked_workers():
    values = [bytes([i % 256]) * (i % 50) for i in range(1000)]
    loader = AsyncLoader(
        Records(SharedList(values)), batch_size=64, num_workers=2, mp_context="fork"
    )
    ids, lengths, shared, workers, _ = (torch.cat(t) for t in zip(*loader, strict=True))
    assert ids.tolist() == list(range(1000))
    assert lengths.tolist() == [len(v) for v in values]
    assert not shared.any()  # forked: the parent's memory, copy-on-write, not moved
    assert set(workers.tolist()) <= {0, 1}


def _worker_pss_growth(records) -> int:
    """How much the PSS of one forked worker grows from reading the first record to reading
    the last, having read every one in between (one worker, in order)."""
    loader = AsyncLoader(Records(records), batch_size=256, num_workers=1, mp_context="fork")
    pss = torch.cat([batch[4] for batch in loader])
    return int(pss[-1] - pss[0])


@pytest.mark.parametrize("kind", [list, SharedList])
def test_a_worker_reading_every_record_does_not_copy_them(kind):
    """A forked worker that reads all of a 96 MiB SharedList grows its PSS by less than 10% of
    it; reading a list of the same records copies them (the control: the measure sees it)."""
    values = [bytes(RECORD_BYTES) for _ in range(RECORDS)]
    data = RECORD_BYTES * RECORDS
    records = kind(values)
    if kind is SharedList:
        del values
    gc.collect()
    growth = _worker_pss_growth(records)
    if kind is SharedList:
        assert growth < data // 10, f"grew {growth / 2**20:.1f} MiB of {data / 2**20:.0f}"
    else:
        assert growth > data // 4, f"grew {growth / 2**20:.1f} MiB of {data / 2**20:.0f}"
