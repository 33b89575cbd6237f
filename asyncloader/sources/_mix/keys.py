"""A :class:`~asyncloader.sources.Mix` of sync map-style sources read as a map-style dataset:
its sampler yields keys, drawn where the sampler is iterated (the loader's event loop); the
samples are read wherever the dataset's ``__getitem__`` runs (the workers, or the loader's
fetch threads).

A key is an int: ``~(index << shift | number)`` for item ``index`` of source ``number``
(sources numbered in sorted-name order; ``shift`` the bits that hold a number), so negative:
an index of another sampler (``>= 0``) is refused, not read. Ints, because keys travel to
the workers with every batch, where a tuple costs several times an int to pickle.

The keys are the draws of the sync iteration (:mod:`.sync`), made the same way from the
same :class:`~asyncloader.sources._mix.run.Run`: the k-th key is the k-th sample's, so the
map path and the iterable path give the same samples in the same order. The run's state
(``Mix.state_dict()``) counts the keys handed out.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from asyncloader.sources._mix.draw import CHUNK
from asyncloader.sources._mix.run import Run, took


def shift_of(sources: int) -> int:
    """The bits of a key that hold the source's number, of ``sources`` sources."""
    return (sources - 1).bit_length()


def encode(number: int, index: int, shift: int) -> int:
    """The key of item ``index`` of source ``number``."""
    return ~(index << shift | number)


def decode(key: Any, shift: int) -> tuple[int, int]:
    """``(source number, index)`` of ``key``.

    Raises:
        TypeError: ``key`` is not a Mix's key (an int < 0).
    """
    if not isinstance(key, int) or isinstance(key, bool) or key >= 0:
        raise bad_key(key)
    return ~key & ((1 << shift) - 1), ~key >> shift


def bad_key(key: Any) -> TypeError:
    return TypeError(
        f"a Mix's keys come from its loader_sampler() (negative ints), got {key!r}: use "
        "DataLoader(mix, sampler=mix.loader_sampler()), or read the Mix with iter()"
    )


def mix_keys(run: Run) -> Iterator[int]:
    """The keys of ``run``'s epoch (see the module docstring), each counted in the run's
    cursor before it goes out."""
    return itertools.chain.from_iterable(_blocks(run))


def _blocks(run: Run) -> Iterator[Iterator[int]]:
    """Iterators over the keys of ``run``'s draws, a block at a time, handed out from
    :attr:`Run.segment` (its state counts those taken from it); the final state kept at the
    epoch's end."""
    c, shift = run.cursor, shift_of(len(run.members))
    while True:
        picks, items, _ = run.block_arrays(c, CHUNK)
        if not len(picks):
            break
        run.segment = (picks, iter((~(items << shift | picks)).tolist()))
        yield run.segment[1]
        took(c, picks)
        run.segment = None
    run.ended()


class MixSampler(Sampler[int]):
    """The sampler of a map-style Mix (``Mix.loader_sampler()``): each ``iter()`` is an
    iteration of the Mix where it stands (its epoch, or the state loaded), as ``iter(mix)``
    is; ``len()`` is the Mix's; ``set_epoch`` is the Mix's. Already this rank's share: the
    Mix splits each source across ranks itself."""

    def __init__(self, mix: Any) -> None:
        self.mix = mix

    def __iter__(self) -> Iterator[int]:
        return mix_keys(self.mix._open_run(Run))

    def __len__(self) -> int:
        return len(self.mix)

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"MixSampler({self.mix!r})"
