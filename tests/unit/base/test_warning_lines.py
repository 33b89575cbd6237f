"""asyncloader's warnings name the user's line (as DataLoader's do), however deep inside the
package they are raised: the first frame outside it, not a fixed count of frames that a
refactoring moves."""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import IterableDataset

from asyncloader import AsyncLoader
from asyncloader._base import available_cores
from tests.helpers.sources import SyncSource


class Overlong(IterableDataset):
    """Reports 4 items and yields 8: DataLoader's length warning."""

    def __len__(self) -> int:
        return 4

    def __iter__(self):
        return iter(range(8))


def _where(caught: list[warnings.WarningMessage], words: str) -> list[tuple[str, int]]:
    return [(w.filename, w.lineno) for w in caught if words in str(w.message)]


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


def test_too_many_workers_names_the_constructor_line():
    many = (available_cores() or 1) + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncLoader(SyncSource(4), num_workers=many)  # <- many
    assert _where(caught, "worker processes in total") == [(__file__, _line_of("# <- many"))]


def test_a_pin_memory_without_cuda_names_the_constructor_line():
    if torch.cuda.is_available():
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AsyncLoader(SyncSource(4), pin_memory=True)  # <- pin
    assert _where(caught, "pin_memory=True") == [(__file__, _line_of("# <- pin"))]


def test_a_source_longer_than_its_length_names_the_loop_that_pulls_past_it():
    loader = AsyncLoader(Overlong(), batch_size=None)
    assert len(loader) == 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [int(x) for x in loader]  # <- pull
    assert got == list(range(8))
    where = set(_where(caught, "was reported to be"))
    assert where == {(__file__, _line_of("# <- pull"))}
