"""The start of one epoch, decided on the consumer's thread when ``iter(loader)`` is called.

Everything random about an epoch is drawn here, in DataLoader's order: the epoch's seed first
(:func:`start_epoch`), then, once the workers are forked, the sampler's first indices
(:func:`with_sampler`; the workers do not inherit an epoch's index list, as under DataLoader).
Doing it on the consumer's thread (not whenever the loop's thread gets to it) makes a seeded
``generator``, or torch's global RNG, give DataLoader's order. A resumed epoch restores the
RNG state it began with, so its draws repeat.

The sampler's iterator is pulled through a :class:`SamplerCursor`. An epoch whose every batch
the consumer took, but which was left without reaching the end (a trainer that stops after
``len(loader)`` batches), is run to the sampler's end before the next epoch draws
(:meth:`SamplerCursor.drain`): torch's ``RandomSampler`` draws once more from the generator
at its end, and when that happens must not depend on how far the loop's thread got.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from asyncloader._base import (
    SourceKind,
    draw_seed,
    is_stateful,
    open_iterator,
    restore_dataset,
    shuffled_batches,
    source_state,
    supplies_sampler,
)
from asyncloader._checkpoint import (
    Progress,
    Resume,
    decode_rng,
    fresh_state,
    resume_point,
    warn_replayed,
)
from asyncloader._config import Options, SamplerCut
from asyncloader._pipeline.claims import Claim, claim_for


@dataclass(frozen=True, slots=True)
class EpochStart:
    """How one epoch begins.

    Attributes:
        number: The epoch's number (0 for the loader's first).
        seed: This epoch's seed: workers' base seed and per-sample seeds derive from it.
        rng: The RNG state the epoch's draws started from (kept for checkpoints).
        index_iter: The (batch) sampler's iterator, already started (map-style sources), once
            :func:`with_sampler` gave it.
        resume: Where a resumed epoch starts (``Resume()`` for a fresh one).
        source_iter: The iterator (or async iterator) of an iterable source, made by its
            ``__iter__`` (``__aiter__``) here, on the consumer's thread, as DataLoader does.
        claim: ``(claim, token)`` when ``source_iter`` is the dataset itself: pulls check
            that this epoch still owns it (see :mod:`asyncloader._pipeline.claims`).
        first_seq: The seq of the first batch an iterable source (or the sampler of a
            dataset that supplies it) will give: ``resume.start`` when the source restored
            its own state, else 0 (earlier batches are then pulled and dropped).
        source_state: ``(first_seq, state)``: an iterable source's own state (see
            :func:`~asyncloader._base.source_state.source_state`) before its first batch, when
            it or its iterator keeps one (``state_dict``/``load_state_dict``), or that of a
            dataset that supplies its sampler and keeps one; else ``None``.
        cuts: With ``distributed=True``: the interruptions at other world sizes whose
            remainder this epoch is (see :mod:`asyncloader._config.rank_sampler`); ``()`` for a
            whole epoch.
    """

    number: int
    seed: int
    rng: tuple[str, torch.Tensor]
    index_iter: SamplerCursor | None
    resume: Resume
    source_iter: Any = None
    claim: tuple[Claim, object] | None = None
    first_seq: int = 0
    source_state: tuple[int, Any] | None = None
    cuts: tuple[SamplerCut, ...] = ()
    #: The RNG state the sampler draws from when the epoch replays torch's global one
    #: (``"global"``, mid-epoch resume): the state after the seed's draw.
    sampler_rng: tuple[str, torch.Tensor] | None = None


def start_epoch(options: Options, number: int, state: dict[str, Any] | None) -> EpochStart:
    """Draws the epoch's seed and starts its sampler; restores ``state``'s position first.

    Args:
        number: The epoch's number when not resumed.
        state: A checked ``state_dict()`` to continue from, or ``None``.
    """
    generator = options.generator
    resume = resume_point(state) if state else Resume()
    number = state["epoch"] if state else number
    cuts = tuple(tuple(c) for c in state.get("distributed", {}).get("history", ())) if state else ()
    tell = (lambda: tell_epoch(options, number, cuts)) if options.distributed else None
    mid_epoch = bool(resume.start or resume.skip)
    restore_dataset(options.dataset, resume.source_state or {}, tell, mid_epoch)
    replayed = decode_rng(state["rng"]) if state else None
    with _rng_replayed(generator, replayed):
        rng = capture_rng(generator)
        seed = draw_seed(generator)  # before the sampler draws, as DataLoader does
        after = ("global", torch.get_rng_state()) if replayed and replayed[0] == "global" else None
    source_iter, claim, first_seq, kept = _start_source(options, resume)
    return EpochStart(
        number=number,
        seed=seed,
        rng=rng,
        index_iter=None,
        sampler_rng=after,
        resume=resume,
        source_iter=source_iter,
        claim=claim,
        first_seq=first_seq,
        source_state=kept,
        cuts=cuts,
    )


def with_sampler(options: Options, start: EpochStart) -> EpochStart:
    """``start`` with its (batch) sampler started (map-style sources): the first indices are
    drawn now, from the RNG state the seed's draw left. The sampler a dataset supplies is
    iterated here and its keys batched as its ``BatchSampler`` would, so that the dataset's
    state (a ``Mix``'s) is taken between its ``iter()`` and its first key: where that
    iteration starts (see :func:`recorded`)."""
    if not options.kind.is_map:
        return start
    with _rng_replayed(options.generator, start.sampler_rng):
        if not supplies_sampler(options.dataset):
            return dataclasses.replace(start, index_iter=SamplerCursor(start_sampler(options)))
        try:
            keys = iter(options.sampler)  # the dataset's iteration opens here
        except Exception as exc:
            return dataclasses.replace(start, index_iter=SamplerCursor(_raising(exc)))
        kept = None
        if is_stateful(options.dataset):
            kept = (start.first_seq, source_state(options.dataset))
        batches = keys if options.batch_size is None else _batched(keys, options)
        cursor = SamplerCursor(_first_drawn(batches))
    return dataclasses.replace(start, index_iter=cursor, source_state=kept)


class SamplerCursor:
    """An epoch's (batch) sampler iterator, pulled under a lock by the loop's thread and
    finished by the consumer's (:meth:`drain`), or let go (:meth:`close`); either way its
    indices are released once it is done."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator: Iterator[Any] | None = iterator
        self._lock = threading.Lock()

    def __iter__(self) -> SamplerCursor:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._iterator is None:
                raise StopIteration
            try:
                return next(self._iterator)
            except StopIteration:
                self._iterator = None
                raise

    def drain(self) -> None:
        """Runs the sampler to its end (its last draws included) unless it got there or was
        let go; errors are the epoch's, already reported or never to be."""
        with self._lock:
            iterator, self._iterator = self._iterator, None
            if iterator is not None:
                with contextlib.suppress(Exception):
                    for _ in iterator:
                        pass

    def close(self) -> None:
        """Lets the sampler go where it stands (its indices are freed)."""
        with self._lock:
            self._iterator = None


def tell_rank(options: Options) -> None:
    """``distributed=True`` with an explicit ``rank``: an iterable source, or a dataset that
    supplies its sampler, with ``set_rank`` is told its place, once, before any worker takes
    a copy of it (without one, it finds torch.distributed's itself, as ``ShardedSource``
    and ``Mix`` do)."""
    set_rank = getattr(options.dataset, "set_rank", None)
    explicit = options.rank is not None
    splits_itself = not options.kind.is_map or supplies_sampler(options.dataset)
    if options.distributed and explicit and splits_itself and callable(set_rank):
        set_rank(options.rank, options.world_size)


def tell_epoch(options: Options, number: int, cuts: tuple[SamplerCut, ...]) -> None:
    """``distributed=True``: the sampler, the batch sampler and an iterable source that have
    ``set_epoch`` are told the epoch (workers iterating their own copies are told it when
    their iteration opens); the loader's own sampler also the remainder it continues."""
    if options.kind.is_map:
        targets = [options.sampler, options.batch_sampler]
        targets.append(getattr(options.batch_sampler, "sampler", None))
    else:
        targets = [None if options.worker_streams else options.dataset]
    told: list[Any] = []
    for target in targets:
        set_epoch = getattr(target, "set_epoch", None)
        if callable(set_epoch) and not any(target is t for t in told):
            set_epoch(number)
            told.append(target)
    if options.own_sampler is not None:
        options.own_sampler.history = list(cuts)


@contextlib.contextmanager
def _rng_replayed(
    generator: torch.Generator | None, rng: tuple[str, torch.Tensor] | None
) -> Iterator[None]:
    """Within: draws repeat the saved epoch's. A saved generator state is set on ``generator``
    for good (it goes on from there, as it did). torch's global state is set only for the
    block when the epoch had begun (your loop drew from it since, and restores it itself), for
    good when the state was saved between epochs (``next_global``: nothing drew from it yet)."""
    if rng is not None and rng[0] == "generator" and generator is not None:
        generator.set_state(rng[1])
    if rng is not None and rng[0] == "next_global":
        torch.set_rng_state(rng[1])
    if rng is None or rng[0] != "global":
        yield
        return
    saved = torch.get_rng_state()
    torch.set_rng_state(rng[1])
    try:
        yield
    finally:
        torch.set_rng_state(saved)


def _start_source(
    options: Options, resume: Resume
) -> tuple[Any, tuple[Claim, object] | None, int, tuple[int, Any] | None]:
    """Starts an iterable source's iterator and restores its state (the dataset's own state is
    restored before: torchdata's order is the dataset's, ``iter()``, the iterator's).

    Returns:
        ``(iterator, claim, first_seq, (first_seq, state) or None)``: the state is the
        iterable source's before the first batch it will give, when it keeps one.
    """
    dataset, saved = options.dataset, resume.source_state or {}
    if options.kind.is_map:
        return None, None, _first_seq(options, resume), None
    if options.worker_streams:  # iterated in the workers (see asyncloader._pipeline.worker_streams)
        merge = resume.source_state or fresh_state(options.num_workers)
        return None, None, resume.start, (resume.start, merge)
    claim, token = claim_for(dataset), object()
    with claim.lock:  # a pull of an older epoch of this object finishes first
        iterator = open_iterator(dataset, saved, options.kind is SourceKind.ASYNC_ITERABLE)
        if iterator is dataset:
            claim.owner = token
    owned = (claim, token) if iterator is dataset else None
    state = source_state(dataset, iterator)
    if state is None:
        if resume.start or resume.skip:
            warn_replayed(dataset, resume.start)
        return iterator, owned, 0, None
    first_seq = resume.start if resume.source_state is not None else 0
    return iterator, owned, first_seq, (first_seq, state)


def _first_seq(options: Options, resume: Resume) -> int:
    """The seq of a map-style epoch's first batch: for a dataset that supplies its sampler
    and keeps a state (``Mix``), the first batch not received when a state of its was
    loaded (it put the sampler there: see :func:`recorded`); else 0 (the sampler is
    stepped over up to it)."""
    dataset = options.dataset
    if not (supplies_sampler(dataset) and is_stateful(dataset)):
        return 0
    return resume.start if (resume.source_state or {}).get("dataset") is not None else 0


def recorded(
    index_iter: Iterator[Any], dataset: Any, progress: Progress, first_seq: int
) -> Iterator[Any]:
    """The batches of a dataset that supplies its sampler and keeps a state (``Mix``): its
    ``state_dict()`` says where its sampler stands, so it is recorded after each batch as
    the state before the next, as an iterable source's is, and a state loaded puts the
    sampler where it was (the batches before it are ``first_seq`` placeholders, which the
    epoch steps over). The protocol asks a new value of each ``state_dict()`` call (a
    Mix's is): it is kept as it is, not copied."""
    yield from itertools.repeat(None, first_seq)
    state_dict = dataset.state_dict
    for seq, indices in enumerate(index_iter, first_seq):
        progress.source_state_before(seq + 1, {"dataset": state_dict(), "iterator": None})
        yield indices


def capture_rng(generator: torch.Generator | None) -> tuple[str, torch.Tensor]:
    """The state the epoch's random draws start from: the generator's, or torch's global one."""
    if generator is not None:
        return "generator", generator.get_state()
    return "global", torch.get_rng_state()


def _batched(keys: Iterator[Any], options: Options) -> Iterator[list[Any]]:
    """``keys`` in batches, as ``BatchSampler(sampler, batch_size, drop_last)`` makes them."""
    size = options.batch_size
    assert size is not None
    while batch := list(itertools.islice(keys, size)):
        if len(batch) < size and options.drop_last:
            return
        yield batch


def start_sampler(options: Options) -> Iterator[Any]:
    """The (batch) sampler's iterator with its first element drawn now (errors kept for later).
    ``shuffle=True``'s samplers give their batches sliced from the permutation
    (:func:`~asyncloader._base.compat.shuffled_batches`)."""
    sampler = options.batch_sampler if options.batch_sampler is not None else options.sampler
    return _first_drawn(shuffled_batches(sampler) or iter(sampler))


def _first_drawn(it: Iterator[Any]) -> Iterator[Any]:
    """``it`` with its first element drawn now (errors kept for later)."""
    try:
        first = next(it)
    except StopIteration:
        return iter(())
    except Exception as exc:
        return _raising(exc)
    return itertools.chain((first,), it)


def _raising(exc: Exception) -> Iterator[Any]:
    raise exc
    yield
