"""Packed: the token lists of an iterable source's rows packed into rows of ``seq_len``.

Row ``r`` holds tokens ``r * seq_len`` to ``(r + 1) * seq_len`` of the source's documents
concatenated in order (each followed by ``eos_id`` when given); the incomplete last row of an
epoch is dropped. Beside the tokens, ``position_ids`` count each document's tokens from 0 and
restart where a document begins or a row begins, the fixed-shape form of the document
boundaries that variable-length attention reads (as Hugging Face's flattening collators
give it), so ``default_collate`` batches the rows as they are.

State: the iterator's ``state_dict()`` is the source's own state (dataset and iterator, as
the loader reads it) after the last document taken, plus the tokens taken from it and not
yet emitted (the carry, at most one document's): a resume continues the packing exactly.
For a source that keeps no state, the state counts the documents taken instead, and a
resume reads and drops that many from the epoch's start. Each worker packs its own copy's
documents: deterministic for a source that splits itself deterministically.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from asyncloader._base import check_int, open_iterator, restore_dataset, source_state


class Packed(IterableDataset[dict[str, torch.Tensor]]):
    """Rows of ``seq_len`` tokens packed from the documents of ``source`` (see the module
    docstring).

    Args:
        source: An iterable dataset (sync, or async: then so is the Packed) whose items are
            dicts holding a document's tokens
            under ``key`` (a list of ints, a 1-d array or tensor).
        seq_len: Tokens per row, >= 1.
        key: Where the tokens are in each item, and the key of the packed tokens.
        eos_id: Appended after each document when given.

    Yields:
        ``{key: LongTensor[seq_len], "position_ids": LongTensor[seq_len]}``.

    ``set_epoch`` and ``set_rank`` are passed on to ``source``.
    """

    def __init__(
        self, source: Any, seq_len: int, *, key: str = "input_ids", eos_id: int | None = None
    ) -> None:
        if not hasattr(source, "__iter__") and not hasattr(source, "__aiter__"):
            raise TypeError(f"source must be an iterable dataset, got {type(source).__name__}")
        check_int("seq_len", seq_len, 1)
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}")
        if eos_id is not None:
            check_int("eos_id", eos_id, 0)
        self.source, self.seq_len, self.key, self.eos_id = source, seq_len, key, eos_id

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def set_rank(self, rank: int, world_size: int) -> None:
        set_rank = getattr(self.source, "set_rank", None)
        if callable(set_rank):
            set_rank(rank, world_size)

    def __new__(cls, source: Any = None, *args: Any, **kwargs: Any) -> Packed:
        """A :class:`Packed` of an async source (``__aiter__``, which the loader prefers too)
        is an async iterable."""
        if cls is Packed and hasattr(source, "__aiter__"):
            cls = _AsyncPacked
        return super().__new__(cls)

    def __iter__(self) -> PackedIterator:
        return PackedIterator(self)

    def __repr__(self) -> str:
        eos = "" if self.eos_id is None else f", eos_id={self.eos_id}"
        return f"Packed({self.source!r}, seq_len={self.seq_len}, key={self.key!r}{eos})"


class PackedIterator(Iterator[dict[str, torch.Tensor]]):
    """One pass of a :class:`Packed`: the source is opened at the first ``next()``, after
    ``load_state_dict`` (the loader's order) put it back where a saved state left it.

    Invariant: ``carry`` (tokens) and ``starts`` (their position ids) are what the documents
    taken so far hold past the last row emitted, and ``source_state(source, iterator)`` is
    the source's place after those documents.
    """

    def __init__(self, packed: Packed) -> None:
        self._packed = packed
        self._saved: dict[str, Any] | None = None  # the source's own state to open it at
        self._skip = 0  # documents to drop once opened (a source without a state of its own)
        self._taken = 0  # documents taken since it was opened, dropped ones included
        self._inner: Iterator[Any] | None = None
        self._carry: list[int] = []
        self._positions: list[int] = []
        self._ended = False

    def state_dict(self) -> dict[str, Any]:
        """The source's own state after the documents taken (else how many to drop), and the
        carry."""
        inner, source = self._inner, self._packed.source
        if inner is None:  # not opened yet: where it will open
            own, skip = self._saved, self._skip
        else:
            own = source_state(source, inner)
            skip = 0 if own is not None else self._taken
        return {
            "source": own,
            "skip": skip,
            "carry": list(self._carry),
            "positions": list(self._positions),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (one :meth:`state_dict` returned), before the first row."""
        if self._inner is not None:
            raise RuntimeError("Packed: load_state_dict() after the iteration began")
        carry, positions = list(state["carry"]), list(state["positions"])
        if len(carry) != len(positions):
            raise ValueError("Packed state: carry and positions differ in length")
        self._saved, self._carry, self._positions = state["source"], carry, positions
        self._skip = int(state["skip"])

    def _open(self) -> Iterator[Any]:
        inner: Iterator[Any] = self._opened(False)
        for _ in range(self._skip):  # what the saved state took, read again and dropped
            next(inner)
            self._taken += 1
        return inner

    def _opened(self, is_async: bool) -> Any:
        """The source's iterator, at the saved state's place (its own state)."""
        saved = self._saved or {}
        source = self._packed.source
        restore_dataset(source, saved, None, True)
        self._inner = open_iterator(source, saved, is_async)
        return self._inner

    def __next__(self) -> dict[str, torch.Tensor]:
        inner = self._inner if self._inner is not None else self._open()
        while len(self._carry) < self._packed.seq_len and not self._ended:
            try:
                item = next(inner)
            except StopIteration:
                self._ended = True
                break
            self._taken += 1
            self._take(item)
        return self._row()

    def _row(self) -> dict[str, torch.Tensor]:
        """The next row from the carry; StopIteration when it holds less than a row (the
        epoch's incomplete last row is dropped)."""
        seq_len = self._packed.seq_len
        if len(self._carry) < seq_len:
            raise StopIteration
        tokens, self._carry = self._carry[:seq_len], self._carry[seq_len:]
        positions, self._positions = self._positions[:seq_len], self._positions[seq_len:]
        return {
            self._packed.key: torch.tensor(tokens, dtype=torch.long),
            "position_ids": torch.tensor(_restart(positions), dtype=torch.long),
        }

    def _take(self, item: Any) -> None:
        key = self._packed.key
        try:
            tokens = item[key]
        except (KeyError, TypeError, IndexError):
            raise KeyError(
                f"Packed: an item of the source has no {key!r} (got {type(item).__name__})"
            ) from None
        doc = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        if self._packed.eos_id is not None:
            doc.append(self._packed.eos_id)
        self._carry.extend(doc)
        self._positions.extend(range(len(doc)))


class _AsyncPacked(Packed):
    """A :class:`Packed` of an async source: iterated with ``async for``."""

    def __aiter__(self) -> AsyncPackedIterator:
        return AsyncPackedIterator(self)

    def __iter__(self) -> PackedIterator:
        raise TypeError("this Packed has an async source: iterate it with `async for`")


class AsyncPackedIterator(PackedIterator, AsyncIterator[dict[str, torch.Tensor]]):
    """One pass of a :class:`Packed` of an async source (the same state as
    :class:`PackedIterator`)."""

    async def _aopen(self) -> Any:
        inner = self._opened(True)
        for _ in range(self._skip):
            await anext(inner)
            self._taken += 1
        return inner

    async def __anext__(self) -> dict[str, torch.Tensor]:
        inner: Any = self._inner if self._inner is not None else await self._aopen()
        while len(self._carry) < self._packed.seq_len and not self._ended:
            try:
                item = await anext(inner)
            except StopAsyncIteration:
                self._ended = True
                break
            self._taken += 1
            self._take(item)
        try:
            return self._row()
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


def _restart(positions: list[int]) -> list[int]:
    """``positions`` with a leading run that continues a document renumbered from 0: a row
    begins at position 0, whatever part of a document it begins with."""
    if not positions or positions[0] == 0:
        return positions
    out = list(positions)
    shift = out[0]
    i = 0
    while i < len(out) and (i == 0 or out[i] != 0):
        out[i] -= shift
        i += 1
    return out
