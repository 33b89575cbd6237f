"""Packed: rows of seq_len tokens whose concatenation is the documents' tokens in order,
position ids restarting at each document and row, and a resume that continues exactly."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import IterableDataset

from asyncloader import AsyncLoader
from asyncloader.sources import Packed


def documents(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` documents of 1 to 40 tokens; token values name the document and position."""
    rng = random.Random(seed)
    return [[1000 * d + t for t in range(rng.randint(1, 40))] for d in range(n)]


class Docs(IterableDataset):
    """Documents as ``{"input_ids": [...]}`` rows; its iterator keeps its position
    (torchdata's protocol) unless ``stateless``."""

    def __init__(self, docs: list[list[int]], stateless: bool = False) -> None:
        self.docs, self.stateless = docs, stateless

    def __iter__(self):
        return _Stateless(self.docs) if self.stateless else _DocsIterator(self.docs)


class _Stateless:
    def __init__(self, docs):
        self.docs, self.i = docs, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.docs):
            raise StopIteration
        self.i += 1
        return {"input_ids": self.docs[self.i - 1], "id": self.i - 1}


class _DocsIterator(_Stateless):
    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def expected_rows(docs, seq_len, eos_id=None):
    """The rows and position ids packing must give, built the plain way."""
    stream, positions = [], []
    for doc in docs:
        doc = doc + ([eos_id] if eos_id is not None else [])
        stream += doc
        positions += range(len(doc))
    rows = []
    for r in range(len(stream) // seq_len):
        tokens = stream[r * seq_len : (r + 1) * seq_len]
        pos = positions[r * seq_len : (r + 1) * seq_len]
        if pos[0] != 0:  # a row begins at 0, even inside a document
            shift, i = pos[0], 0
            while i < len(pos) and (i == 0 or pos[i] != 0):
                pos[i] -= shift
                i += 1
        rows.append((tokens, pos))
    return rows


@pytest.mark.parametrize("seq_len", [1, 7, 64])
@pytest.mark.parametrize("eos_id", [None, 2])
def test_rows_concatenate_the_documents_in_order(seq_len, eos_id):
    docs = documents(60)
    got = [
        (row["input_ids"].tolist(), row["position_ids"].tolist())
        for row in Packed(Docs(docs), seq_len, eos_id=eos_id)
    ]
    assert got == expected_rows(docs, seq_len, eos_id)
    assert all(len(tokens) == seq_len for tokens, _ in got)


def test_the_loader_batches_packed_rows_with_the_default_collate():
    docs = documents(50)
    loader = AsyncLoader(Packed(Docs(docs), 16, eos_id=0), batch_size=4)
    batches = list(loader)
    want = expected_rows(docs, 16, 0)
    assert batches[0]["input_ids"].shape == (4, 16)
    assert batches[0]["input_ids"].dtype == torch.long
    got = [
        (t.tolist(), p.tolist())
        for b in batches
        for t, p in zip(b["input_ids"], b["position_ids"], strict=True)
    ]
    assert got == want


@pytest.mark.parametrize("stateless", [False, True], ids=["stateful", "replayed"])
@pytest.mark.parametrize("stop_after", [1, 3, 6])
def test_a_resume_mid_epoch_continues_the_packing_exactly(stateless, stop_after):
    docs = documents(80, seed=stop_after)
    whole = [b["input_ids"].tolist() for b in AsyncLoader(Packed(Docs(docs), 24), batch_size=2)]
    loader = AsyncLoader(Packed(Docs(docs, stateless), 24), batch_size=2)
    first, it = [], iter(loader)
    for _ in range(stop_after):
        first.append(next(it)["input_ids"].tolist())
    state = loader.state_dict()
    del it
    resumed = AsyncLoader(Packed(Docs(docs, stateless), 24), batch_size=2)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].tolist() for b in resumed]
    assert first + rest == whole


def test_the_iterators_state_holds_the_carry_and_loads_before_the_first_row():
    docs = documents(30)
    it = iter(Packed(Docs(docs), 10))
    taken = [next(it)["input_ids"].tolist() for _ in range(5)]
    state = it.state_dict()
    again = iter(Packed(Docs(docs), 10))
    again.load_state_dict(state)
    rest = [row["input_ids"].tolist() for row in again]
    assert taken + rest == [t for t, _ in expected_rows(docs, 10)]
    with pytest.raises(RuntimeError, match="after the iteration began"):
        it.load_state_dict(state)


def test_arrays_and_tensors_of_tokens_are_packed_as_lists():
    docs = [torch.arange(5), torch.arange(5, 9)]

    class Tensors(IterableDataset):
        def __iter__(self):
            return iter({"input_ids": d} for d in docs)

    rows = [r["input_ids"].tolist() for r in Packed(Tensors(), 3)]
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="seq_len"):
        Packed(Docs([]), 0)
    with pytest.raises(TypeError, match="source"):
        Packed(42, 8)
    with pytest.raises(TypeError, match="key"):
        Packed(Docs([]), 8, key=3)
    with pytest.raises(KeyError, match="'tokens'"):
        list(Packed(Docs(documents(3)), 4, key="tokens"))


def test_set_epoch_and_set_rank_reach_the_source():
    told = []

    class Told(Docs):
        def set_epoch(self, epoch):
            told.append(("epoch", epoch))

        def set_rank(self, rank, world_size):
            told.append(("rank", rank, world_size))

    packed = Packed(Told(documents(3)), 4)
    packed.set_epoch(3)
    packed.set_rank(1, 2)
    assert told == [("epoch", 3), ("rank", 1, 2)]


class SplitDocs(Docs):
    """Each worker's copy takes every ``num_workers``-th document (get_worker_info)."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        docs = self.docs if info is None else self.docs[info.id :: info.num_workers]
        return _DocsIterator(docs)


def test_each_worker_packs_its_own_share_and_resumes_it():
    docs = documents(90, seed=5)
    opts = {"batch_size": 2, "num_workers": 2, "fetch_in_workers": True}
    share = sorted(t for w in (0, 1) for t, _ in expected_rows(docs[w::2], 12))
    whole = [
        r for b in AsyncLoader(Packed(SplitDocs(docs), 12), **opts) for r in b["input_ids"].tolist()
    ]
    assert sorted(whole) == share
    loader = AsyncLoader(Packed(SplitDocs(docs), 12), **opts)
    it, first = iter(loader), []
    for _ in range(5):
        first += next(it)["input_ids"].tolist()
    state = loader.state_dict()
    del it
    resumed = AsyncLoader(Packed(SplitDocs(docs), 12), **opts)
    resumed.load_state_dict(state)
    rest = [r for b in resumed for r in b["input_ids"].tolist()]
    assert first + rest == whole


def test_an_async_source_packs_asynchronously_and_resumes_exactly(tmp_path):
    """Packed over ParquetSource (async): an async iterable, rows as over the same documents
    read synchronously, and the loader's state resumes mid-epoch exactly."""
    import json

    from asyncloader.sources import ParquetSource
    from tests.helpers.columnar import parquet_set, rows

    paths = []
    for name, data in parquet_set([40, 25], 10).items():
        paths.append(str(tmp_path / name))
        (tmp_path / name).write_bytes(data)
    packed = Packed(ParquetSource(paths, columns=["tokens"]), 5, key="tokens", eos_id=99)
    assert hasattr(packed, "__aiter__")
    with pytest.raises(TypeError, match="async for"):
        iter(packed)
    documents = [{"tokens": r["tokens"]} for r in rows(0, 65)]
    reference = list(AsyncLoader(Packed(documents, 5, key="tokens", eos_id=99), batch_size=2))

    def make():
        source = ParquetSource(paths, columns=["tokens"])
        return AsyncLoader(Packed(source, 5, key="tokens", eos_id=99), batch_size=2)

    got = list(make())
    assert len(got) == len(reference)
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a["tokens"], b["tokens"])
        assert torch.equal(a["position_ids"], b["position_ids"])
    first = make()
    it = iter(first)
    seen = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(first.state_dict()))
    it.close()
    second = make()
    second.load_state_dict(state)
    rest = list(second)
    assert [b["tokens"].tolist() for b in seen + rest] == [b["tokens"].tolist() for b in got]
