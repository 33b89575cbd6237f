"""map_structure: nested containers keep their types around replaced leaves."""

from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import torch

from asyncloader._base.structure import DESCEND, map_structure, tensors_of

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
