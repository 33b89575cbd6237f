"""A ``datasets.Dataset`` in torch format is read a batch of columns at a time where that is the
batch DataLoader makes, and as DataLoader reads it everywhere else: the same batches, dtypes,
containers and errors as DataLoader's in every placement, memory the batch owns."""

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from asyncloader import AsyncLoader
from asyncloader._worker.columns import ColumnReader, _owned, column_batch, reads_columns

datasets = pytest.importorskip("datasets")

N, BATCH, SEED = 50, 8, 3
PLACEMENTS = [
    pytest.param({}, id="workers=0"),
    pytest.param({"fetch_threads": 2}, id="workers=0-threads=2"),
    pytest.param({"num_workers": 2}, id="workers=2"),
    pytest.param({"num_workers": 2, "fetch_in_workers": True}, id="fetch-in-workers"),
]


def table(n=N):
    rows = np.arange(n)
    return {
        "label": rows,
        "x": np.stack([rows, rows * 2]).T.astype(np.float32),
        "name": [f"row{i}" for i in rows],
    }


def torch_dataset(n=N):
    return datasets.Dataset.from_dict(table(n)).with_format("torch")


def plain(batch):
    """A batch as comparable values: its type, and each column's dtype and values."""
    if isinstance(batch, torch.Tensor):
        return (str(batch.dtype), batch.tolist())
    if isinstance(batch, dict):
        return (type(batch).__name__, [(k, plain(v)) for k, v in batch.items()])
    if isinstance(batch, list):
        return [plain(v) for v in batch]
    return batch


def dataloaders(dataset, **options):
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, **options)
    return [plain(b) for b in loader]


def ours(dataset, placement, **options):
    with AsyncLoader(dataset, batch_size=BATCH, shuffle=True, **placement, **options) as loader:
        return [plain(b) for b in loader]


@pytest.fixture
def getitems_calls(tmp_path, monkeypatch):
    """Counts ``datasets.Dataset.__getitems__`` calls, workers' included (a line each in a
    file); the class's own method stays the one both names point to."""
    log = tmp_path / "getitems.log"
    original = datasets.Dataset.__getitems__

    def logged(self, keys):
        with open(log, "a") as f:
            f.write(json.dumps(len(keys)) + "\n")
        return original(self, keys)

    monkeypatch.setattr(datasets.Dataset, "__getitems__", logged)
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_torch_format_is_read_by_columns_with_dataloaders_batches(placement, getitems_calls):
    dataset = torch_dataset()
    want = dataloaders(dataset, generator=torch.Generator().manual_seed(SEED))
    assert getitems_calls() == len(want)  # DataLoader reads rows
    got = ours(dataset, placement, generator=torch.Generator().manual_seed(SEED))
    assert got == want
    assert getitems_calls() == len(want)  # we did not


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"collate_fn": lambda rows: default_collate(rows)}, id="own-collate"),
        pytest.param({"transform": lambda row: row}, id="transform"),
        pytest.param({"on_error": "skip", "max_skipped": 1}, id="skip"),
    ],
)
def test_other_pipelines_read_rows(options, getitems_calls):
    dataset = torch_dataset()
    want = dataloaders(dataset, generator=torch.Generator().manual_seed(SEED))
    calls = getitems_calls()
    got = ours(dataset, {}, generator=torch.Generator().manual_seed(SEED), **options)
    assert got == want
    assert getitems_calls() == calls + len(want)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_column_left_unformatted_reads_rows_as_dataloader(placement):
    """``output_all_columns``: ``label`` stays a list of ints, which default_collate makes a
    tensor, so the columns are not the batch."""
    dataset = datasets.Dataset.from_dict(table()).with_format(
        "torch", columns=["x"], output_all_columns=True
    )
    assert dataloaders(dataset, generator=torch.Generator().manual_seed(SEED)) == ours(
        dataset, placement, generator=torch.Generator().manual_seed(SEED)
    )


@pytest.mark.parametrize("form", ["numpy", "python", None])
def test_other_formats_are_not_read_by_columns(form):
    dataset = datasets.Dataset.from_dict(table()).with_format(form)
    assert not reads_columns(dataset)
    assert dataloaders(dataset, generator=torch.Generator().manual_seed(SEED)) == ours(
        dataset, {}, generator=torch.Generator().manual_seed(SEED)
    )


def test_a_subclass_with_its_own_getitems_is_read_through_it():
    class Doubled(datasets.Dataset):
        def __getitems__(self, keys):
            return [{"label": row["label"] * 2} for row in super().__getitems__(keys)]

    dataset = torch_dataset()
    doubled = Doubled(dataset.data).with_format("torch", columns=["label"])
    assert reads_columns(dataset) and not reads_columns(doubled)
    got = ours(doubled, {}, generator=torch.Generator().manual_seed(SEED))
    assert sorted(v for batch in got for v in batch[1][0][1][1]) == list(range(0, 2 * N, 2))


def ragged():
    """Rows 0-7 (the first batch) all of 3 values; later ones of 1 to 3."""
    seqs = [[i] * 3 if i < BATCH else [i] * (1 + i % 3) for i in range(N)]
    return datasets.Dataset.from_dict({"seq": seqs}).with_format("torch")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_ragged_batch_fails_as_under_dataloader(placement):
    """A column of lists of different lengths: torch format gives a list of tensors, which
    default_collate cannot stack. The first batch (all of one length) is read by columns; the
    next fails with DataLoader's error, and so does every later one, each at its own turn."""
    dataset = ragged()
    it = iter(DataLoader(dataset, batch_size=BATCH))
    first = plain(next(it))
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size") as want:
        next(it)
    with AsyncLoader(dataset, batch_size=BATCH, **placement) as loader:
        ours_it = iter(loader)
        assert plain(next(ours_it)) == first
        for _ in range(2):
            with pytest.raises(type(want.value), match="stack expects each tensor"):
                next(ours_it)


def test_a_reader_stops_at_the_first_batch_it_cannot_read():
    dataset, reader = ragged(), ColumnReader()
    assert reader.read(dataset, list(range(BATCH)))["seq"].shape == (BATCH, 3)
    assert reader.read(dataset, list(range(BATCH, 2 * BATCH))) is None
    assert not reader.on and reader.read(dataset, list(range(BATCH))) is None


def test_column_batch_is_the_collated_rows():
    dataset, keys = torch_dataset(), [7, 3, 3, 40]
    assert plain(column_batch(dataset, keys)) == plain(default_collate(dataset.__getitems__(keys)))
    assert column_batch(dataset, []) is None


def test_a_batch_owns_its_memory(monkeypatch):
    """A column that shares memory with what the dataset keeps (as a zero-copy read would
    give: here a view of one tensor) is copied: writing into delivered batches leaves the
    kept memory as it was, and a later epoch reads it unchanged."""
    kept = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
    original = datasets.Dataset.__getitem__

    def zero_copy(self, key):
        batch = original(self, key)
        if isinstance(key, list):  # a batch of consecutive rows (no shuffle): a view
            batch["x"] = kept[key[0] : key[-1] + 1]
        return batch

    monkeypatch.setattr(datasets.Dataset, "__getitem__", zero_copy)
    dataset = torch_dataset()
    assert reads_columns(dataset)
    with AsyncLoader(dataset, batch_size=BATCH) as loader:
        for batch in loader:
            batch["x"].zero_()
        again = [b["x"] for b in loader]
    assert torch.equal(kept, torch.arange(N * 2, dtype=torch.float32).reshape(N, 2))
    assert torch.equal(torch.cat(again), kept)


def test_only_a_tensor_that_owns_its_whole_storage_is_kept():
    fresh = torch.arange(12.0).reshape(4, 3)
    assert _owned(fresh) is fresh
    array = np.arange(12.0).reshape(4, 3)
    borrowed = _owned(torch.from_numpy(array))
    borrowed.zero_()
    assert array.sum() == 66  # a copy: numpy's memory untouched
    for view in (fresh[1:], fresh.T, fresh[:, :2]):
        kept = _owned(view)
        assert kept is not view and torch.equal(kept, view) and kept.is_contiguous()
        assert kept.untyped_storage().data_ptr() != fresh.untyped_storage().data_ptr()
