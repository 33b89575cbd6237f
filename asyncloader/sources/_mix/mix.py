"""Mix: samples drawn from several sources by weight, exact under resume and across ranks.

Every draw is made where the Mix is iterated (the loader's training process), from uniforms
that depend on (seed, epoch, position) only (:mod:`.draws`); the k-th draw of a source
takes that source's k-th sample in its own order. So the mix depends on the seed and the
epoch, never on ``num_workers``, ranks or timing, and its state (:mod:`.state`) is
positions: each source's place and the draws made.

Three classes, chosen by ``Mix(...)`` from its sources: every source sync map-style, a
map-style dataset whose sampler makes the draws (:mod:`.runs`: only keys leave the
training process); an async source, an async iterable; otherwise a sync
``IterableDataset``. Each is a :class:`Mix`.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from asyncloader._base import check_ranks, resolve_ranks
from asyncloader.sources._mix.ahead import AheadSamples, AsyncRun
from asyncloader.sources._mix.draws import Layout
from asyncloader.sources._mix.epochs import Tally, advance, replay
from asyncloader.sources._mix.members import (
    Member,
    all_sync_map,
    any_async,
    check_int,
    check_sources,
    check_stop,
    check_weights,
    refuse_copies,
    share_of,
)
from asyncloader.sources._mix.runs import (
    MixSampler,
    Run,
    SyncRun,
    bad_key,
    decode,
    shift_of,
    sync_samples,
)
from asyncloader.sources._mix.state import (
    TAILS,
    Setup,
    begun,
    fresh_cursor,
    moved,
    named,
    pack,
    start_of,
    top,
    unpack,
)


class Mix(Dataset[Any]):
    """Samples drawn from several sources, each draw picking a source by weight.

    Args:
        sources: ``{name: source}``: map-style sources (sync or async ``__getitem__`` and
            ``len``; sampled without replacement, in a new order each of their epochs) and
            iterable ones (``ShardedSource``, any sync or async iterable dataset).
        weights: ``{name: weight}`` for the same names; >= 0, not all 0, relative.
        seed: Seeds the draws and the map-style sources' orders; the same on every rank.
        stop: When the epoch ends: ``"first_exhausted"``, when a source drawn has nothing
            left; ``"all_exhausted"`` (default), when every source of weight > 0 has run
            out (one that runs out is left out and the others' weights renormalised);
            ``"never"``, after ``samples_per_epoch`` draws, a source that runs out starting
            its next epoch (and going on from where it stood in the next Mix epoch).
        samples_per_epoch: Draws per epoch on each rank: required with ``"never"``, a cap
            otherwise.
        shuffle: Shuffle each map-style source's order (else its index order).
        concurrency: With an async source: map-style samples fetched at once, ahead of the
            one handed out.
        rank, world_size: This process's place; default torch.distributed's when
            initialised, else one rank. ``AsyncLoader(distributed=True)`` sets them.
        distributed_tail: How a map-style source's epoch splits across ranks when it does not
            divide: ``"pad"`` (as the loader's own sampler) or ``"drop"``.

    Each rank draws the same sequence of sources; each source is split across ranks as it is
    alone (a map-style one as the loader's sampler splits it, an iterable one by itself:
    ``set_rank``/``set_epoch`` are passed on). Call :meth:`set_epoch` before each epoch
    (``AsyncLoader(distributed=True)`` does). :meth:`state_dict` holds each source's
    position and the draws made; a resume continues the mix exactly, also at another world
    size where the sources can move (map-style ones, ``ShardedSource``). :attr:`counts` are
    the samples drawn per source, ahead of the consumer; ``loader.stats.sources`` those
    received (see :meth:`counts_at`).

    Where it runs. Every source sync map-style: the Mix is a map-style dataset (not an
    ``IterableDataset``) whose :meth:`loader_sampler` makes the draws and yields keys
    ``(source number, index)`` (sources numbered in sorted-name order); ``mix[key]`` reads
    ``sources[name][index]``. The loader iterates that sampler on its event loop and reads
    the samples where it reads any map-style dataset's (the workers, ``fetch_in_workers``
    included); ``DataLoader(mix, sampler=mix.loader_sampler())`` works too. ``iter(mix)``
    still gives the same samples, read here. Otherwise (an iterable or an async source) the
    Mix is an iterable (``async for`` with an async source), iterated in one place: with
    ``fetch_in_workers=True`` each worker would iterate a copy, and iterating one there
    raises ValueError. ``Mix(...)`` builds the variant that :func:`variant_for` names.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Mix:
        """An instance of the variant :func:`variant_for` picks for the sources (a subclass
        asked for by name is built as asked)."""
        if cls is Mix:
            cls = variant_for(args[0] if args else kwargs.get("sources"))
        return super().__new__(cls)

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: Mapping[str, float],
        *,
        seed: int = 0,
        stop: str = "all_exhausted",
        samples_per_epoch: int | None = None,
        shuffle: bool = True,
        concurrency: int = 64,
        rank: int | None = None,
        world_size: int | None = None,
        distributed_tail: str = "pad",
    ) -> None:
        names = check_sources(sources)
        check_stop(stop, samples_per_epoch)
        seed = check_int("seed", seed, None)
        concurrency = check_int("concurrency", concurrency, 1)
        if distributed_tail not in TAILS:
            raise ValueError(f"distributed_tail must be one of {TAILS}, got {distributed_tail!r}")
        if (rank is None) != (world_size is None):
            raise ValueError(f"rank and world_size go together, got {rank=} and {world_size=}")
        self._members = [Member(n, sources[n], seed, bool(shuffle)) for n in names]
        self._setup = Setup(tuple(names), seed, stop, bool(shuffle), samples_per_epoch)
        self._weights = check_weights(weights, names, "weights")
        self._pending: list[float] | None = None  # set_weights' change for the next epoch
        self._rank: int | None = None
        self._world: int | None = None
        self._tail, self._concurrency = distributed_tail, concurrency
        self._epoch = 0
        self._base: dict[str, Any] | None = None  # where the next iteration starts
        self._origin: dict[str, Any] | None = None  # "never": set_epoch's, worked out lazily
        self._target: int | None = None
        self._live: Run | None = None  # the latest iteration
        self._begun = False  # the current epoch was iterated or loaded
        self._tally = Tally(self._setup, self._members)  # for counts_at
        if rank is not None and world_size is not None:
            self.set_rank(rank, world_size)

    # -- the loader's protocol -------------------------------------------------------------

    def set_rank(self, rank: int, world_size: int) -> None:
        """Sets this process's place (``AsyncLoader(distributed=True)`` calls it), and the
        iterable sources' that have ``set_rank``. Raises ValueError for another place than
        the one it was built for."""
        check_ranks(rank, world_size)
        if self._rank is not None and (self._rank, self._world) != (rank, world_size):
            raise ValueError(
                f"this Mix was built for rank {self._rank} of {self._world}, the loader is "
                f"rank {rank} of {world_size}"
            )
        self._rank, self._world = rank, world_size
        for member in self._members:
            set_rank = getattr(member.source, "set_rank", None)
            if not member.is_map and callable(set_rank):
                set_rank(rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the next iteration's draws; a weight change waiting
        (:meth:`set_weights`) takes effect. With ``"never"`` the sources go on from where
        the previous epoch left them (worked out on positions if it was not iterated to its
        end); otherwise each starts its epoch ``epoch``."""
        epoch = check_int("epoch", epoch, 0)
        if self._pending is not None and epoch != self._epoch:
            self._weights, self._pending = self._pending, None
        if self._setup.stop == "never":
            if self._target is None:
                self._origin = self._known()
            self._target = epoch
        else:
            self._base, self._target = None, None
        self._epoch, self._live, self._begun = epoch, None, False

    def state_dict(self) -> dict[str, Any]:
        """Where the current (or next) iteration stands: the draws made, each source's place
        and own state, the weights (packed: see :mod:`asyncloader.sources._mix.state`).
        Valid between any two samples; JSON-friendly."""
        if self._live is not None:
            return self._live.state()
        return pack(self._resolved(), named(self._setup.names, self._pending))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue ``state``, whose weights finish its epoch; later
        epochs take a change the state was waiting for, else this Mix's weights. A state of
        another world size is moved first (:meth:`elastic_state`).

        Raises:
            ValueError: ``state`` is malformed, or of another seed, stop, shuffle,
                samples_per_epoch or set of sources.
        """
        loaded = unpack(self._setup, state, self._replay)
        layout = self._layout()
        if loaded["world_size"] != layout.world_size:
            loaded = moved(self._setup, loaded, self._members, layout)
        loaded["rank"] = layout.rank
        names = self._setup.names
        weights = [float(loaded["weights"][n]) for n in names]
        waiting = top(state, "next_weights")
        pending = [float(waiting[n]) for n in names] if waiting is not None else None
        if pending is None and self._weights != weights:
            pending = self._weights
        self._weights, self._pending = weights, pending
        self._base, self._origin, self._target, self._live = loaded, None, None, None
        self._epoch, self._begun = int(loaded["epoch"]), True

    def elastic_state(self, states: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
        """The state that continues, at this Mix's world size, an epoch saved by a rank of
        another: each map-style source's epoch is cut where the old ranks stood (the new
        ranks split the rest, each sample once), each iterable source with
        ``elastic_state`` moves itself; the draws go on from the same position.

        Raises:
            ValueError: Not exactly one state is given (a Mix is iterated in one place), or
                it is not one this Mix can continue.
        """
        given = [s for s in states if s is not None]
        if len(given) != 1:
            raise ValueError(f"elastic_state takes one Mix state, got {len(given)}")
        loaded = unpack(self._setup, given[0], self._replay)
        here = moved(self._setup, loaded, self._members, self._layout())
        return pack(here, top(given[0], "next_weights"))

    # -- weights and counts ----------------------------------------------------------------

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """New weights, from the next epoch (at once if this epoch has not begun: neither
        iterated nor loaded); recorded in the state until then.

        Raises:
            ValueError: A name is unknown or missing, a weight negative or not finite, or
                all are 0.
        """
        new = check_weights(weights, self._setup.names, "weights")
        if self._begun:
            self._pending = new
            return
        self._weights, self._pending = new, None
        if self._base is not None:
            self._base["weights"] = named(self._setup.names, new)

    @property
    def weights(self) -> dict[str, float]:
        """The weights of the current (or next) epoch."""
        return dict(zip(self._setup.names, self._weights, strict=True))

    @property
    def counts(self) -> dict[str, int]:
        """Samples drawn from each source in the current (or last) epoch by its latest
        iteration (with a loader, those it pulled: they run ahead of what you received by at
        most its window; ``loader.stats.sources`` has the received ones, see
        :meth:`counts_at`)."""
        counts: dict[str, int] = self.stats["counts"]
        return counts

    def counts_at(self, state: Mapping[str, Any]) -> dict[str, int]:
        """Samples each source gave in its Mix epoch before the position ``state`` (a
        :meth:`state_dict`, of any iteration of this Mix) records, worked out on positions:
        no data is read. States of one iteration asked in order cost the draws between them.

        The loader's hook: with an iterable dataset that has ``counts_at``, ``loader.stats``
        has ``sources``, the counts at the state of the first batch not received less those
        at the epoch's (or resume's) start: exactly the samples of the batches received.

        Raises:
            ValueError: ``state`` is not one of this Mix's, or past its epoch's end.
        """
        return dict(zip(self._setup.names, self._tally.at(state), strict=True))

    @property
    def stats(self) -> dict[str, Any]:
        """``{"epoch", "drawn", "counts", "exhausted", "source_epochs", "weights"}`` of the
        current (or last) epoch's latest iteration (see :attr:`counts`)."""
        state = self._live.full() if self._live is not None else self._resolved()
        return {
            "epoch": state["epoch"],
            "drawn": state["drawn"],
            "counts": {n: p["drawn"] for n, p in state["sources"].items()},
            "exhausted": list(top(state, "exhausted")),
            "source_epochs": {n: p["epoch"] for n, p in state["sources"].items()},
            "weights": dict(state["weights"]),
        }

    def __len__(self) -> int:
        """Samples per epoch on this rank: ``samples_per_epoch`` with ``"never"``; with
        ``"all_exhausted"`` every sample of the sources of weight > 0 (capped by
        ``samples_per_epoch``; an iterable source needs ``len()``); with
        ``"first_exhausted"``, ``samples_per_epoch`` as a bound.

        Raises:
            TypeError: The length is not known without drawing the epoch.
        """
        limit, stop = self._setup.samples_per_epoch, self._setup.stop
        if stop == "never" or (stop == "first_exhausted" and limit is not None):
            return int(limit)  # type: ignore[arg-type]
        if stop == "first_exhausted":
            raise TypeError("len() of a Mix with stop='first_exhausted' needs samples_per_epoch")
        share, total = share_of(self._members, self._layout()), 0
        for i, member in enumerate(self._members):
            if self._weights[i] > 0:
                n = share(i, self._epoch, [])
                total += len(member.source) if n is None else n
        return total if limit is None else min(total, limit)

    # -- iterating -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return sync_samples(self._open_run(SyncRun))  # type: ignore[arg-type]

    def _open_run(self, kind: type[Run]) -> Run:
        """Starts an iteration where the Mix stands; the one after starts its epoch anew."""
        refuse_copies()
        layout = self._layout()
        began = self._resolved()
        if began["world_size"] != layout.world_size:
            began = moved(self._setup, began, self._members, layout)
        began = {**began, "rank": layout.rank}
        self._base = start_of(self._setup, began)
        self._live = run = kind(self, began, layout)
        self._begun = True
        return run

    def _layout(self) -> Layout:
        rank, world_size = resolve_ranks(self._rank, self._world)
        return Layout(rank, world_size, self._tail)

    def _resolved(self) -> dict[str, Any]:
        """The state the next iteration starts from (working out a pending ``set_epoch``)."""
        if self._target is not None and self._origin is not None:
            self._base = self._advance(self._origin, self._target)
            self._origin = self._target = None
        if self._base is None:
            self._base = self._fresh(self._epoch)
        return self._base

    def _fresh(self, epoch: int) -> dict[str, Any]:
        """Mix epoch ``epoch`` from its start, nothing carried over (with ``"never"``: from
        epoch 0, run forward on positions)."""
        never = self._setup.stop == "never"
        cursor = fresh_cursor(self._setup, 0 if never else epoch, 0 if never else epoch)
        state = begun(self._setup, cursor, self._weights, self._layout())
        return self._advance(state, epoch) if never and epoch else state

    def _known(self) -> dict[str, Any]:
        """The latest exact position known: the end of the last iteration when it reached
        it, else where it began, else where the next one would begin."""
        live = self._live
        if live is not None:
            return live.final if live.final is not None else live.began
        return self._resolved()

    def _advance(self, origin: dict[str, Any], epoch: int) -> dict[str, Any]:
        """``"never"``: the start of Mix epoch ``epoch`` after ``origin`` (see
        :func:`.epochs.advance`); before ``origin``'s epoch, worked out from epoch 0."""
        if epoch < origin["epoch"]:
            return self._fresh(epoch)
        return advance(self._setup, self._members, origin, epoch, self._weights, self._layout())

    def _replay(self, base: dict[str, Any], drawn: int) -> dict[str, Any]:
        return replay(self._setup, self._members, base, drawn)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickled) holds no iteration: it stands where the current one stands, as
        if its state had been loaded."""
        state = self.__dict__.copy()
        if self._live is not None:
            state["_base"], state["_live"] = self._live.full(), None
        return state

    def __repr__(self) -> str:
        inner = ", ".join(f"{m.name!r}: {m.source!r}" for m in self._members)
        return f"Mix({{{inner}}}, weights={self.weights}, stop={self._setup.stop!r})"


class _MapMix(Mix):
    """A Mix of sync map-style sources only: a map-style dataset whose keys (negative ints,
    see :mod:`.runs`) its sampler (:meth:`loader_sampler`) draws."""

    def loader_sampler(self) -> MixSampler:
        """The loader's protocol (``AsyncLoader`` iterates this instead of a sampler of its
        own): the keys of each epoch, drawn where it is iterated, this rank's share. Each
        ``iter()`` is an iteration of this Mix; :meth:`state_dict` says where it stands."""
        return MixSampler(self)

    def locate(self, key: int) -> tuple[str, int]:
        """``(source name, index)`` that ``key`` (one of :meth:`loader_sampler`'s) reads.

        Raises:
            TypeError: ``key`` is not such a key.
        """
        number, index = decode(key, shift_of(len(self._members)))
        return self._setup.names[number], index

    def __getitem__(self, key: int) -> Any:
        """``sources[name][index]`` for a key of :meth:`loader_sampler`'s (:meth:`locate`).

        Raises:
            TypeError: ``key`` is not such a key (an index of another sampler, say).
        """
        number, index = decode(key, shift_of(len(self._members)))
        try:
            return self._members[number].source[index]
        except Exception as exc:
            self._note(exc, number, index)
            raise

    def __getitems__(self, keys: Sequence[int]) -> list[Any]:
        """The samples of ``keys``, in one call (DataLoader's batch read, and the loader's);
        a source with a ``__getitems__`` of its own reads its items in one call too."""
        shift = shift_of(len(self._members))
        if keys and max(keys) >= 0:
            raise bad_key(max(keys))
        if any(m.getitems is not None for m in self._members):
            return self._grouped(keys, shift)
        getters, mask = [m.source.__getitem__ for m in self._members], (1 << shift) - 1
        out: list[Any] = []
        append = out.append
        try:
            for x in map(operator.invert, keys):
                append(getters[x & mask](x >> shift))
        except Exception as exc:
            self._note(exc, *decode(keys[len(out)], shift))
            raise
        return out

    def _grouped(self, keys: Sequence[int], shift: int) -> list[Any]:
        """:meth:`__getitems__` a source at a time: each source's items in one call of its
        ``__getitems__`` (or one at a time), put back in the order of ``keys``."""
        places: dict[int, list[int]] = {}
        for at, key in enumerate(keys):
            places.setdefault(decode(key, shift)[0], []).append(at)
        out: list[Any] = [None] * len(keys)
        for number, where in places.items():
            member, items = self._members[number], [~keys[at] >> shift for at in where]
            try:
                got = (
                    member.getitems(items)
                    if member.getitems
                    else list(map(member.source.__getitem__, items))
                )
            except Exception as exc:
                self._note(exc, number, None)
                raise
            for at, sample in zip(where, got, strict=True):
                out[at] = sample
        return out

    def _note(self, exc: BaseException, number: int, index: int | None) -> None:
        what = f" item {index}" if index is not None else ""
        exc.add_note(f"asyncloader.sources.Mix: sources[{self._setup.names[number]!r}]{what}")


class _IterableMix(Mix, IterableDataset[Any]):
    """A Mix with a sync iterable source: a sync ``IterableDataset``, which the loader pulls
    in the training process."""


class _AsyncMix(_IterableMix):
    """A Mix with an async source: an async iterable (``async for``), which the loader
    iterates on its event loop."""

    def __aiter__(self) -> AsyncIterator[Any]:
        run = self._open_run(AsyncRun)
        return AheadSamples(run, self._concurrency)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("this Mix has an async source: iterate it with `async for`")


def variant_for(sources: Any) -> type[Mix]:
    """The kind of Mix that ``sources`` get, so that the loader reads it in the right place:

    - every source sync and map-style: :class:`_MapMix`, a map-style dataset whose sampler
      draws (samples are read wherever the loader reads map-style samples, workers too);
    - any source async: :class:`_AsyncMix`, an async iterable the loader iterates on its
      event loop (sync map-style members are then read through it too);
    - otherwise (a sync iterable among them): :class:`_IterableMix`, a sync
      ``IterableDataset`` the loader pulls in the training process.

    Sources that are not a mapping get :class:`_IterableMix`, whose ``__init__`` says what is
    wrong with them.
    """
    if all_sync_map(sources):
        return _MapMix
    return _AsyncMix if any_async(sources) else _IterableMix
