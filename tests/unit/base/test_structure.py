"""map_structure: nested containers keep their types around replaced leaves."""

import gc
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from asyncloader._base.structure import DESCEND, arrays_of, map_structure, nbytes, tensors_of

Point = namedtuple("Point", "x y")


@dataclass(frozen=True)
class Pair:
    a: torch.Tensor
    meta: str


def plus_one(x):
    return x + 1 if isinstance(x, torch.Tensor) else DESCEND


def test_nested_containers_keep_their_types_and_the_input_is_untouched():
    """dicts, lists, tuples, namedtuples and (frozen) dataclasses are rebuilt, not mutated."""
    batch = OrderedDict(p=Point(torch.zeros(1), [torch.ones(1), "s"]), d=Pair(torch.zeros(2), "m"))
    out = map_structure(batch, plus_one)
    assert isinstance(out, OrderedDict) and isinstance(out["p"], Point)
    assert isinstance(out["d"], Pair) and out["d"].meta == "m"
    assert out["p"].y[1] == "s" and torch.equal(out["p"].y[0], torch.full((1,), 2.0))
    assert torch.equal(out["d"].a, torch.ones(2)) and torch.equal(batch["d"].a, torch.zeros(2))


def test_tensors_of_finds_every_tensor_once():
    """tensors_of returns each reachable tensor, in traversal order."""
    a, b, c = torch.zeros(1), torch.ones(1), torch.zeros(2)
    found = tensors_of({"p": Point(a, [b, "s"]), "d": Pair(c, "m"), "n": None})
    assert [id(t) for t in found] == [id(a), id(b), id(c)]


def test_arrays_of_reads_what_a_walk_would_offer():
    """arrays_of finds the tensors and arrays map_structure would offer, in its order, through
    rows of scalars and token lists; it rebuilds nothing."""
    a, b, c = torch.zeros(1), np.ones(3), torch.ones(2, 2)
    rows = [{"id": i, "tokens": list(range(5)), "text": "t"} for i in range(4)]
    batch = {"rows": rows, "p": Point(a, [1, b]), "d": Pair(c, "m"), "s": "x", "n": None}
    offered: list[Any] = []

    def offer(x: Any) -> Any:
        if isinstance(x, torch.Tensor | np.ndarray):
            offered.append(x)
            return x
        return DESCEND

    map_structure(batch, offer)
    assert [id(x) for x in arrays_of(batch)] == [id(x) for x in offered] == [id(a), id(b), id(c)]
    assert arrays_of(rows) == [] and arrays_of([1, "a", None]) == [] and arrays_of(a) == [a]
    assert nbytes(batch) == 4 + 24 + 16


def test_a_worker_pickles_rows_of_python_objects_once_and_arrays_go_their_own_way():
    """A batch with no tensor or array leaves a worker pickled already (one pass, no search
    for arrays first) and comes out of the answer's unpickling as it was; a batch holding one
    anywhere, or that does not pickle, goes the way it went before."""
    import pickle

    from asyncloader._worker.transport import Pickled, WithArrays, pickled_without_arrays, to_shared

    rows = [{"id": i, "tokens": [i] * 3, "text": f"row {i}"} for i in range(3)]
    sent = to_shared(rows)
    assert type(sent) is Pickled
    assert pickle.loads(pickle.dumps({"answer": sent})) == {"answer": rows}
    assert pickled_without_arrays([*rows, {"tokens": torch.zeros(2)}]) is None
    assert pickled_without_arrays({"deep": [[{"x": np.zeros(2)}]]}) is None
    assert pickled_without_arrays([lambda: 0]) is None  # its sending reports it
    big = [{"id": 0, "x": np.zeros(1 << 18)}]  # 2 MiB: shared memory
    assert type(to_shared(big)) is WithArrays


@pytest.mark.parametrize(
    "walk", [tensors_of, nbytes, arrays_of, lambda b: map_structure(b, lambda x: DESCEND)]
)
def test_a_walk_keeps_nothing_alive(walk: Callable[[Any], Any]) -> None:
    """A walk over a batch leaves no reference cycle behind: the batch's memory (a worker's
    shared segment) goes when the user drops the batch, not at the collector's next pass."""
    was = gc.isenabled()
    gc.disable()
    try:
        batch = {"x": [torch.zeros(4), (torch.ones(2), "s")], "y": Pair(torch.zeros(1), "m")}
        alive = weakref.ref(batch["x"][0])
        walk(batch)
        del batch
        assert alive() is None, "the walk left a cycle holding the batch"
    finally:
        if was:
            gc.enable()
