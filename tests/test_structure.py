"""map_structure: nested containers keep their types around replaced leaves."""

import gc
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from asyncloader._base.structure import DESCEND, map_structure, nbytes, tensors_of

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


@pytest.mark.parametrize(
    "walk", [tensors_of, nbytes, lambda b: map_structure(b, lambda x: DESCEND)]
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
