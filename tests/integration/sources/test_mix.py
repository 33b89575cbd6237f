"""Mix: sources drawn by weight; the stop rules; the same mix whatever the placement; exact
resume at every position, with workers, across ranks and at another world size; the
loader's contract checkers over it.

Samples are strings that name their source (``"a3"``: item 3 of source ``a``; ``"s1.2"``:
sample 2 of epoch 1 of stream ``s``; a shard's sample key), so a run's source sequence and
each source's own sequence can be read off what the loader delivers.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import random
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from asyncloader import AsyncLoader
from asyncloader.sources import Mix, ShardedSource, SourceKind, source_kind
from asyncloader.sources._mix.draws import CHUNK, random_chunk
from tests.helpers import Draws, shard_set
from tests.helpers.contracts import (
    STOPS,
    check_bounded_window,
    check_clean_shutdown,
    check_exactly_once,
    check_order,
    check_repeatable,
    check_resume,
    epoch,
    ran_ahead,
    state_after,
)
from tests.helpers.waiting import wait_event

pytestmark = pytest.mark.timeout(60)

SIZES = [5, 7, 4]  # tar shards: 16 samples, 8 a rank of 2
BATCH = 3


class Named:
    """Map-style: item ``i`` is ``f"{name}{i}"``."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> str:
        return f"{self.name}{index}"


class Gauge:
    """Fetches in flight now, and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0


class AsyncNamed(Named):
    """Named with ``async def __getitem__``, counted in ``gauge`` while in flight."""

    def __init__(self, name: str, n: int, gauge: Gauge | None = None) -> None:
        super().__init__(name, n)
        self.gauge = gauge or Gauge()

    async def __getitem__(self, index: int) -> str:  # type: ignore[override]
        self.gauge.now += 1
        self.gauge.most = max(self.gauge.most, self.gauge.now)
        await asyncio.sleep(0.001)
        self.gauge.now -= 1
        return f"{self.name}{index}"


class Stream:
    """A stateless iterable with ``set_epoch``: ``f"{name}{epoch}.{i}"`` for i < n."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n, self.epoch = name, n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return (f"{self.name}{self.epoch}.{i}" for i in range(self.n))


class Failing(Named):
    def __getitem__(self, index: int) -> str:
        if index == 2:
            raise KeyError(f"no item {index}")
        return super().__getitem__(index)


class AsyncFailing(AsyncNamed):
    async def __getitem__(self, index: int) -> str:  # type: ignore[override]
        if index == 2:
            raise KeyError(f"no item {index}")
        return await super().__getitem__(index)


def key_of(sample: dict) -> str:
    return sample["__key__"]


def source_of(sample: str) -> str:
    return "t" if "-" in sample else sample[0]  # a shard's key: s000-0001


def shard_paths(folder) -> list[str]:
    """The tar shards of SIZES, written in ``folder``."""
    paths = []
    for name, data in shard_set(len(SIZES), SIZES).items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return paths


@pytest.fixture
def shards(tmp_path):
    return shard_paths(tmp_path)


def mixed(stop="all_exhausted", asynchronous=False, shards=None, **kw) -> Mix:
    """Two map-style sources (``b`` async with ``asynchronous``), a stream, and with
    ``shards`` a ShardedSource ``t`` of them."""
    sources = {
        "a": Named("a", 7),
        "b": (AsyncNamed if asynchronous else Named)("b", 5),
        "s": Stream("s", 4),
    }
    weights = {"a": 1.0, "b": 2.0, "s": 1.0}
    if shards is not None:
        opts = dict(samples_per_shard=SIZES, shuffle_buffer=4, seed=1, decode=key_of)
        sources["t"] = ShardedSource(shards, **opts)
        weights["t"] = 2.0
    if stop == "never":
        kw.setdefault("samples_per_epoch", 20)
    return Mix(sources, weights, stop=stop, **{"seed": 5} | kw)


def mapped(stop="all_exhausted", **kw) -> Mix:
    """Three sync map-style sources: a Mix read as a map-style dataset (the map path)."""
    sources = {"a": Named("a", 7), "b": Named("b", 5), "c": Named("c", 4)}
    if stop == "never":
        kw.setdefault("samples_per_epoch", 20)
    return Mix(sources, {"a": 1.0, "b": 2.0, "c": 1.0}, stop=stop, **{"seed": 5} | kw)


#: The Mix of the iterable path (a stream among its sources) and of the map path.
BUILDS = [pytest.param(mixed, id="iterable"), pytest.param(mapped, id="map")]


def drawn(mix) -> list:
    """Everything the Mix yields, iterated here."""
    if hasattr(mix, "__aiter__"):

        async def run() -> list:
            return [s async for s in mix]

        return asyncio.run(run())
    return list(mix)


def loader(mix, **kw) -> AsyncLoader:
    return AsyncLoader(mix, batch_size=BATCH, collate_fn=list, **kw)


def flat(batches) -> list:
    return [s for b in batches for s in b]


def received(samples: list, names: str = "abst") -> dict[str, int]:
    """Each source's samples among ``samples`` (read off the samples themselves)."""
    return dict.fromkeys(names, 0) | Counter(map(source_of, samples))


# -- arguments ----------------------------------------------------------------------------


GOOD = {"a": Named("a", 3), "b": Named("b", 3)}
BAD = [
    (dict(sources=[1, 2]), TypeError, "sources must be a dict"),
    (dict(sources={}), ValueError, "at least one source"),
    (dict(sources={1: Named("a", 3)}, weights={1: 1}), TypeError, "names must be str"),
    (dict(sources={"a": 3}, weights={"a": 1}), TypeError, r"sources\['a'\] must be map-style"),
    (dict(weights={"a": 1, "b": 1, "z": 1}), ValueError, "weights names 'z'"),
    (dict(weights={"a": 1}), ValueError, "weights lacks 'b'"),
    (dict(weights={"a": 1, "b": -1}), ValueError, r"weights\['b'\] must be finite and >= 0"),
    (dict(weights={"a": 1, "b": math.nan}), ValueError, r"weights\['b'\]"),
    (dict(weights={"a": 1, "b": True}), TypeError, r"weights\['b'\] must be a number"),
    (dict(weights={"a": 0, "b": 0}), ValueError, "weights are all 0"),
    (dict(stop="sometimes"), ValueError, "stop must be one of"),
    (dict(stop="never"), ValueError, "needs samples_per_epoch"),
    (dict(samples_per_epoch=0), ValueError, "samples_per_epoch must be >= 1"),
    (dict(concurrency=0), ValueError, "concurrency must be >= 1"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(distributed_tail="wrap"), ValueError, "distributed_tail must be one of"),
    (dict(rank=0), ValueError, "rank and world_size go together"),
    (dict(rank=2, world_size=2), ValueError, "rank=2 must be in"),
]


@pytest.mark.parametrize(("kw", "error", "match"), BAD, ids=[b[2] for b in BAD])
def test_bad_arguments_are_refused_naming_them(kw, error, match):
    args = dict(sources=GOOD, weights={"a": 1, "b": 1}) | kw
    with pytest.raises(error, match=match):
        Mix(**args)


def test_bad_weights_and_states_are_refused_naming_them():
    mix = Mix(GOOD, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="weights names 'c'"):
        mix.set_weights({"a": 1, "b": 1, "c": 1})
    state = mix.state_dict()
    with pytest.raises(ValueError, match="saved with seed=0, this Mix has seed=1"):
        Mix(GOOD, {"a": 1, "b": 1}, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['sources'\] holds \['a', 'b'\]"):
        Mix({**GOOD, "c": Named("c", 1)}, {"a": 1, "b": 1, "c": 1}).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['drawn'\] must be an int >= its base's 0"):
        mix.load_state_dict(state | {"drawn": -1})
    with pytest.raises(ValueError, match=r"state\['base'\] must be the JSON"):
        mix.load_state_dict(state | {"base": "{"})
    base = json.loads(state["base"])
    base["sources"]["a"]["taken"] = -1
    with pytest.raises(ValueError, match=r"state\['sources'\]\['a'\]\['taken'\]"):
        mix.load_state_dict(state | {"base": json.dumps(base)})
    with pytest.raises(ValueError, match=r"state\['drawn'\]=99 is past its epoch's end"):
        mix.load_state_dict(state | {"drawn": 99})
    assert mix.state_dict() == state  # a refused state leaves the Mix as it was


# -- the draw rules -----------------------------------------------------------------------


def test_all_exhausted_gives_every_sample_once_each_source_in_its_own_order():
    """Every sample of every source of weight > 0 comes once; a map-style source comes in a
    permutation (its index order unshuffled), a stream in its own order; weight 0: never."""
    sources = {"a": Named("a", 30), "b": Named("b", 20), "s": Stream("s", 10), "z": Named("z", 5)}
    weights = {"a": 3, "b": 1, "s": 1, "z": 0}
    out = drawn(Mix(sources, weights, shuffle=False))
    assert Counter(out) == Counter([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(20)]
                                   + [f"s0.{i}" for i in range(10)])  # fmt: skip
    assert [s for s in out if s[0] == "a"] == [f"a{i}" for i in range(30)]
    assert [s for s in out if s[0] == "s"] == [f"s0.{i}" for i in range(10)]
    shuffled = [s for s in drawn(Mix(sources, weights)) if s[0] == "a"]
    assert sorted(shuffled) == sorted(f"a{i}" for i in range(30)) and shuffled != sorted(shuffled)


def test_first_exhausted_ends_where_a_source_is_found_empty():
    """The same draws as ``"all_exhausted"`` until a source drawn has nothing left: the epoch
    ends there, every source short of its end but the one that ran out."""
    both = {stop: drawn(mixed(stop)) for stop in ("all_exhausted", "first_exhausted")}
    first = both["first_exhausted"]
    assert 0 < len(first) < len(both["all_exhausted"])
    assert first == both["all_exhausted"][: len(first)]
    sizes, got = {"a": 7, "b": 5, "s": 4}, Counter(s[0] for s in first)
    assert [name for name in sizes if got[name] == sizes[name]] != []


def two_never_epochs() -> list:
    mix = mixed("never", samples_per_epoch=40)
    assert len(mix) == 40
    out = drawn(mix)
    mix.set_epoch(1)
    return out + drawn(mix)


def test_never_restarts_a_source_with_its_next_epoch():
    """A source that runs out starts its next epoch: a new permutation; a stream is told
    its next epoch. Each Mix epoch has samples_per_epoch samples."""
    out = two_never_epochs()
    assert len(out) == 80
    a = [s for s in out if s[0] == "a"]
    whole = [sorted(a[start : start + 7]) for start in range(0, len(a) - 6, 7)]
    assert whole == [[f"a{i}" for i in range(7)]] * len(whole) and a[:7] != a[7:14]
    streams = [s for s in out if s[0] == "s"]
    assert streams == [f"s{k // 4}.{k % 4}" for k in range(len(streams))]


def test_the_next_never_epoch_goes_on_from_where_each_source_stood():
    """Also when the epoch before was left early: its end is worked out on positions."""
    out = two_never_epochs()
    left = mixed("never", samples_per_epoch=40)
    next(iter(left))  # epoch 0 left after one sample
    left.set_epoch(1)
    assert drawn(left) == out[40:]


def test_proportions_over_100k_draws_are_within_one_percent_of_the_weights():
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    sources = {name: Named(name, 1000) for name in weights}
    mix = Mix(sources, weights, stop="never", samples_per_epoch=100_000)
    counts = Counter(s[0] for s in mix)
    for name, weight in weights.items():
        assert abs(counts[name] / 100_000 - weight) < 0.01, (name, counts)


def test_the_draws_depend_on_seed_and_epoch_only():
    """Same seed and epoch, same mix (what the sources hold does not change which source
    each draw picks); another seed or epoch, another."""
    one = drawn(mixed())
    assert drawn(mixed()) == one
    other = Mix({"a": Named("x", 7), "b": Named("y", 5), "s": Stream("z", 4)},
                {"a": 1.0, "b": 2.0, "s": 1.0}, seed=5)  # fmt: skip
    assert [s[0] for s in drawn(other)] == [{"a": "x", "b": "y", "s": "z"}[s[0]] for s in one]
    assert drawn(mixed(seed=6)) != one
    later = mixed()
    later.set_epoch(1)
    assert drawn(later) != one


def test_an_async_mix_fetches_ahead_and_gives_the_sync_mix():
    """With an async source the Mix is an async iterable: map-style samples fetched
    ``concurrency`` at once, handed out in the same order as the sync Mix's."""
    mix = mixed(asynchronous=True, concurrency=4)
    assert not hasattr(mixed(), "__aiter__") and hasattr(mix, "__aiter__")
    assert drawn(mix) == drawn(mixed())
    with pytest.raises(TypeError, match="async for"):
        iter(mix)
    gauge = Gauge()
    both = {name: AsyncNamed(name, 40, gauge) for name in "xy"}
    assert len(drawn(Mix(both, {"x": 1, "y": 1}, concurrency=4))) == 80
    assert gauge.most == 4


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_failing_source_raises_its_own_error_naming_source_and_item(asynchronous):
    failing = AsyncFailing("f", 4) if asynchronous else Failing("f", 4)
    mix = Mix({"f": failing}, {"f": 1}, shuffle=False)
    with pytest.raises(KeyError, match="no item 2") as caught:
        drawn(mix)
    assert any("sources['f'] item 2" in note for note in caught.value.__notes__)


def test_an_empty_source_cannot_be_restarted():
    for empty in (Named("e", 0), Stream("e", 0)):
        mix = Mix({"a": Named("a", 3), "e": empty}, {"a": 1, "e": 1}, stop="never",
                  samples_per_epoch=50)  # fmt: skip
        with pytest.raises(ValueError, match=r"sources\['e'\] has no samples"):
            drawn(mix)


def test_set_weights_takes_effect_at_the_next_epoch_and_is_kept_in_the_state():
    """A change during an epoch waits for the next (recorded in the state meanwhile, so a
    resume keeps it); before an epoch begins, it takes effect at once."""
    mix = mixed()
    it = iter(mix)
    first = [next(it) for _ in range(3)]
    mix.set_weights({"a": 0, "b": 1, "s": 0})
    assert first + list(it) == drawn(mixed())
    state = json.loads(json.dumps(mix.state_dict()))
    assert state["next_weights"] == {"a": 0, "b": 1, "s": 0}
    resumed = mixed()
    resumed.load_state_dict(state)
    for each in (mix, resumed):
        each.set_epoch(1)
        assert {s[0] for s in drawn(each)} == {"b"}
    fresh = mixed()
    fresh.set_weights({"a": 1, "b": 0, "s": 0})
    assert {s[0] for s in drawn(fresh)} == {"a"}


def test_a_copy_stands_where_the_iteration_stands():
    """A Mix pickled mid-epoch (as for a worker, or copy.deepcopy) goes on from there."""
    reference = drawn(mixed())
    mix = mixed()
    it = iter(mix)
    first = [next(it) for _ in range(5)]
    assert first + drawn(pickle.loads(pickle.dumps(mix))) == reference
    assert first + list(it) == reference


def test_counts_and_stats_say_what_each_source_gave():
    mix = mixed()
    out = drawn(mix)
    stats = mix.stats
    assert mix.counts == stats["counts"] == dict(Counter(s[0] for s in out))
    assert stats["drawn"] == len(out) and sorted(stats["exhausted"]) == ["a", "b", "s"]


@pytest.mark.parametrize("stop", ["all_exhausted", "never"])
def test_counts_at_a_state_are_the_samples_before_it(shards, stop):
    """counts_at(state) after any k samples: each source's among the first k, asked in
    order, backwards, or of another Mix of the same setup; another seed's is refused."""
    mix, out = mixed(stop, shards=shards), []
    states = [mix.state_dict()]

    async def take() -> None:
        async for sample in mix:
            out.append(sample)
            states.append(json.loads(json.dumps(mix.state_dict())))

    asyncio.run(take())
    other = mixed(stop, shards=shards)
    for k in [*range(len(states)), *reversed(range(len(states)))]:
        assert mix.counts_at(states[k]) == received(out[:k]) == other.counts_at(states[k]), k
    with pytest.raises(ValueError, match="seed"):
        mixed(stop, shards=shards, seed=6).counts_at(states[3])


# -- resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["all_exhausted", "first_exhausted", "never"])
def test_resume_at_every_position_of_the_iteration_itself(stop, shards):
    """state_dict() after any k samples, through JSON, continues the same samples."""
    reference = drawn(mixed(stop, shards=shards))
    for k in range(len(reference) + 1):
        mix = mixed(stop, shards=shards)
        it = aiter(mix)

        async def take(it=it, k=k):
            got = [await anext(it) for _ in range(k)]
            await it.aclose()
            return got

        seen = asyncio.run(take())
        resumed = mixed(stop, shards=shards)
        resumed.load_state_dict(json.loads(json.dumps(mix.state_dict())))
        assert seen + drawn(resumed) == reference, k


PLACEMENTS = [pytest.param({}, id="workers=0"), pytest.param({"num_workers": 2}, id="workers=2")]
IN_WORKERS = {"num_workers": 2, "fetch_in_workers": True}
ALL_PLACEMENTS = [*PLACEMENTS, pytest.param(IN_WORKERS, id="fetch-in-workers")]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_loader_resumes_at_every_position(placement, asynchronous):
    """The contract checker over Mix: stopped after any k batches, resumed in a new loader,
    the same batches follow; the mix is the one iterated alone, for any num_workers."""
    make = lambda **kw: loader(mixed(asynchronous=asynchronous), **placement | kw)  # noqa: E731
    check_order(epoch(make(), list), drawn(mixed()))
    check_resume(make, key=list)


@pytest.mark.parametrize("build", BUILDS)
def test_the_loader_resumes_a_never_mix_across_epochs(build):
    """distributed=True tells the epochs: states between and inside epochs continue exactly
    (the sources going on from where the epoch before left them)."""
    make = lambda: loader(build("never"), distributed=True, rank=0, world_size=1)  # noqa: E731
    run = make()
    first, between = epoch(run, list), json.loads(json.dumps(run.state_dict()))
    second, third = epoch(run, list), epoch(run, list)
    again = make()
    again.load_state_dict(between)
    assert [epoch(again, list), epoch(again, list)] == [second, third]
    for k in (1, 4):
        stopped = make()
        epoch(stopped, list)
        it = iter(stopped)
        seen = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(stopped.state_dict()))
        it.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert seen + epoch(resumed, list) == second and epoch(resumed, list) == third
    assert first != second


def counted(run: AsyncLoader, it, got: list) -> list:
    """``got`` and the rest of ``run``'s epoch (iterator ``it``); after each batch,
    ``stats.sources`` are checked to be the samples received of each source."""
    for batch in it:
        got += batch
        assert run.stats.sources == received(got, "".join(run.stats.sources))
    return got


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("stop", ["all_exhausted", "never"])
@pytest.mark.parametrize("build", BUILDS)
def test_loader_stats_count_each_sources_samples_received(shards, placement, stop, build):
    """loader.stats.sources after every batch and at the epoch's end: the samples received
    of each source, though the Mix has drawn ahead of them (a held consumer lets it); in a
    resumed epoch, those received since the resume (as stats.samples)."""
    if build is mixed:
        build = lambda stop: mixed(stop, stop == "never", shards)  # noqa: E731
    make = lambda: loader(build(stop), **placement)  # noqa: E731
    run = make()
    it = iter(run)
    names = "".join(run.stats.sources)
    assert run.stats.sources == received([], names)
    got = list(next(it))
    wait_event(ran_ahead(run), "the Mix to draw ahead of a held consumer")
    assert sum(run.dataset.counts.values()) > len(got) == sum(run.stats.sources.values())
    got, stats = counted(run, it, got), run.stats
    logged = {n[len("sources/") :]: v for n, v in stats.as_dict().items() if "/" in n}
    assert stats.sources == logged == received(got, names)
    assert f"a {received(got, names)['a']} (" in run.report()
    again = flat(epoch(run, list))  # the next epoch counts its own
    assert run.stats.sources == received(again, names)
    assert run.previous_stats.sources == stats.sources
    stopped = make()
    it = iter(stopped)
    seen = flat(next(it) for _ in range(3))
    state = json.loads(json.dumps(stopped.state_dict()))
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = counted(resumed, iter(resumed), [])
    assert seen + rest == got and resumed.stats.samples == len(rest)


def test_fetch_in_workers_is_refused_naming_it_for_an_iterable_mix():
    """A Mix with an iterable source is iterated in one place (a map-only one is read in
    the workers: see the map path's tests)."""
    made = loader(mixed(), num_workers=2, fetch_in_workers=True)
    with pytest.raises(ValueError, match="fetch_in_workers=True"):
        epoch(made, list)


# -- the loader's other contracts -------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_exactly_once_and_the_window(placement):
    """in_order=False: every sample once; a slow consumer stays within the window."""
    made = loader(mixed(), **placement, in_order=False)
    check_exactly_once(epoch(made, list), drawn(mixed()))
    made = loader(mixed(asynchronous=True), **placement, prefetch=2)
    epoch(made, list, slow=True)
    check_bounded_window(made.stats)


@pytest.mark.parametrize("placement", ALL_PLACEMENTS)
def test_exactly_once_and_the_window_of_the_map_path(placement):
    made = loader(mapped(), **placement, in_order=False)
    check_exactly_once(epoch(made, list), drawn(mapped()))
    made = loader(mapped(), **placement, prefetch=2, io_concurrency=4)
    epoch(made, list, slow=True)
    check_bounded_window(made.stats)


REPEATS = [(mixed, False), (mapped, False), (mapped, True)]


@pytest.mark.parametrize(
    ("build", "fetch_in_workers"), REPEATS, ids=["iterable", "map", "map-fetch-in-workers"]
)
def test_draws_in_the_workers_repeat(build, fetch_in_workers):
    """A transform's random draws in the workers repeat with the generator's seed, for 1
    or 2 workers (the mix itself is the Mix's seed's)."""

    def make(num_workers, seed):
        generator = torch.Generator().manual_seed(seed)
        return loader(build(), num_workers=num_workers, transform=Draws(), generator=generator,
                      fetch_in_workers=fetch_in_workers)  # fmt: skip

    check_repeatable(make, list)


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_clean_shutdown(placement, stop):
    check_clean_shutdown(loader(mixed(asynchronous=True), **placement), stop)


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("placement", ALL_PLACEMENTS)
def test_clean_shutdown_of_the_map_path(placement, stop):
    check_clean_shutdown(loader(mapped(), **placement), stop)


# -- ranks ----------------------------------------------------------------------------------


@pytest.fixture(params=["shards", "map"])
def third(request, tmp_path):
    """The shards of the third source of :func:`ranked`, or None: a map-style one (the
    Mix is then read as a map-style dataset)."""
    return None if request.param == "map" else shard_paths(tmp_path)


def ranked(shards, rank, world, stop="all_exhausted", **kw) -> AsyncLoader:
    """A loader of rank ``rank`` of ``world`` over two map-style sources and the shards
    (with ``shards=None`` a third map-style source ``c`` instead)."""
    opts = dict(samples_per_shard=SIZES, shuffle_buffer=4, seed=1, decode=key_of)
    third = Named("c", 6) if shards is None else ShardedSource(shards, **opts)
    sources = {"a": Named("a", 8), "b": Named("b", 6), "c" if shards is None else "t": third}
    more = {"samples_per_epoch": 20} if stop == "never" else {}
    weights = {"a": 1, "b": 2, "c" if shards is None else "t": 2}
    mix = Mix(sources, weights, seed=5, stop=stop, distributed_tail="drop", **more)
    return loader(mix, distributed=True, rank=rank, world_size=world, **kw)


def all_of(shards) -> list:
    """Every sample of :func:`ranked`'s sources."""
    third = [f"c{i}" for i in range(6)] if shards is None else [
        f"s{s:03d}-{i:04d}" for s, n in enumerate(SIZES) for i in range(n)]  # fmt: skip
    return [f"a{i}" for i in range(8)] + [f"b{i}" for i in range(6)] + third


def check_left_once(got: list, world: int, every: list) -> None:
    """Every sample at most once, and of each source fewer than ``world`` left out (the
    drop tail of a split that does not divide)."""
    counts = Counter(got)
    assert max(counts.values()) == 1, [s for s, n in counts.items() if n > 1]
    missing = Counter(source_of(s) for s in set(every) - set(counts))
    assert all(n < world for n in missing.values()), missing
    assert set(counts) <= set(every)


def test_ranks_draw_the_same_sources_and_split_each_source(third):
    """Every rank draws the same sequence of sources; each source is split across ranks as
    it is alone (map-style by rows, the shards by the sharded source's rule): every sample
    once in the job."""
    runs = [flat(epoch(ranked(third, r, 2), list)) for r in range(2)]
    assert [source_of(s) for s in runs[0]] == [source_of(s) for s in runs[1]]
    check_exactly_once([runs[0] + runs[1]], all_of(third))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_two_ranks_resume_at_every_position(third, placement):
    """Rank 0's state after k steps continues both ranks (a new loader each) exactly."""
    reference = [epoch(ranked(third, r, 2, **placement), list) for r in range(2)]
    points = range(len(reference[0]) + 1) if not placement else (0, 2, len(reference[0]))
    for k in points:
        first = ranked(third, 0, 2, **placement)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        it.close()
        for rank in range(2):
            resumed = ranked(third, rank, 2, **placement)
            resumed.load_state_dict(state)
            assert epoch(resumed, list) == reference[rank][k:], (k, rank)


def stopped(third, world, k, stop="all_exhausted"):
    """Every rank of ``world`` after ``k`` steps: the samples they gave, rank 0's state."""
    runs = [ranked(third, r, world, stop) for r in range(world)]
    its = [iter(run) for run in runs]
    before = [s for it in its for _ in range(k) for s in next(it)]
    state = json.loads(json.dumps(runs[0].state_dict()))
    for it in its:
        it.close()
    return before, state


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2)])
def test_a_resume_at_another_world_size_gives_each_sample_left_once(third, old, new):
    """All ranks of ``old`` stop after k steps; ``new`` ranks load rank 0's state: what they
    give is what the old ranks had not, each once (fewer than ``new`` of a source left out
    where its remainder does not divide); with ``"never"`` the sources drawn after the cut
    are the uninterrupted run's (the draws do not depend on the world size)."""
    steps = len(epoch(ranked(third, 0, old), list))
    for k in (1, steps // 2, steps - 1):
        before, state = stopped(third, old, k)
        after = []
        for r in range(new):
            resumed = ranked(third, r, new)
            resumed.load_state_dict(state)
            after += flat(epoch(resumed, list))
        check_left_once(before + after, new, all_of(third))
    before, state = stopped(third, old, 2, "never")
    resumed = ranked(third, 0, new, "never")
    resumed.load_state_dict(state)
    whole = flat(epoch(ranked(third, 0, old, "never"), list))
    assert [source_of(s) for s in before[: 2 * BATCH] + flat(epoch(resumed, list))] == [
        source_of(s) for s in whole]  # fmt: skip


# -- the map path: a Mix of sync map-style sources, read as a map-style dataset ---------------


def keyed(mix) -> list:
    """What the keys of the Mix's sampler read, read here."""
    return [mix[key] for key in mix.loader_sampler()]


class Batched(Named):
    """Named with ``__getitems__``, its calls counted."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name, n)
        self.calls = 0

    def __getitems__(self, indices: list) -> list:
        self.calls += 1
        return [self[i] for i in indices]


def test_a_mix_of_map_style_sources_is_a_map_style_dataset_of_its_samplers_keys():
    """Not an IterableDataset (the loader reads it as a map-style dataset); its keys are
    negative ints that name a source and an index; an index of another sampler is refused."""
    mix = mapped()
    assert isinstance(mix, Mix) and not isinstance(mix, IterableDataset)
    assert source_kind(mix) is SourceKind.MAP and isinstance(mixed(), IterableDataset)
    keys = list(mix.loader_sampler())
    assert len(keys) == len(mix) == 16 and max(keys) < 0
    samples = [f"{name}{index}" for name, index in map(mix.locate, keys)]
    assert samples == [mix[key] for key in keys] == mix.__getitems__(keys) == drawn(mapped())
    for bad in (0, 3, True, 1.5, "a0"):
        with pytest.raises(TypeError, match="loader_sampler"):
            mix[bad]
    with pytest.raises(TypeError, match="loader_sampler"):
        mix.__getitems__([keys[0], 0])


@pytest.mark.parametrize("stop", ["all_exhausted", "first_exhausted", "never"])
def test_the_samplers_keys_read_the_iterations_samples_epoch_after_epoch(stop):
    """The map path's keys read what iterating the Mix gives (the iterable path), with the
    same state after it, over epochs (set_epoch; a weight change at the next epoch)."""
    by_keys, iterated = mapped(stop), mapped(stop)
    for number in range(3):
        assert keyed(by_keys) == drawn(iterated), number
        assert by_keys.state_dict() == iterated.state_dict()
        if number == 1:
            for mix in (by_keys, iterated):
                mix.set_weights({"a": 0, "b": 1, "c": 1})
        for mix in (by_keys, iterated):
            mix.set_epoch(number + 1)


def test_the_uniforms_are_random_randoms():
    """The draw rule's uniforms, made by numpy, are those of ``random.Random(key)``."""
    for key in ("mix:0:0:0", "mix:5:3:17", "mix:-12:0:2", "mix:123456789012345:7:1"):
        draw = random.Random(key).random
        assert random_chunk(key).tolist() == [draw() for _ in range(CHUNK)], key


@pytest.mark.parametrize("placement", ALL_PLACEMENTS)
def test_the_loader_reads_a_map_mix_in_order_and_resumes_at_every_position(placement):
    """The iterable path's samples in its order, for any num_workers, fetch_in_workers
    too; stopped after any k batches and resumed in a new loader, the same batches follow
    (with workers: at a few points, in order and not)."""
    make = lambda **kw: loader(mapped(), **placement | kw)  # noqa: E731
    check_order(epoch(make(), list), drawn(mapped()))
    check_order(epoch(make(), list, mode="async"), drawn(mapped()))
    check_resume(make, None if not placement else (0, 2, 5), key=list)
    if placement:
        check_resume(make, (2,), key=list, in_order=False)


def test_a_map_mix_state_carries_over_between_placements():
    """A state saved with two workers resumes without, and with fetch_in_workers (only
    the Mix's state and the batch count matter)."""
    make = lambda **kw: loader(mapped(), **kw)  # noqa: E731
    check_resume(make, (1, 3), key=list, save_with={"num_workers": 2})
    check_resume(make, (2,), key=list, resume_with=IN_WORKERS)


def test_a_resumed_map_mix_starts_where_its_state_says():
    """The loader saves the Mix's state at the first batch not received and puts the Mix's
    sampler there on resume (not run through the batches received): a state taken at once
    is at the position loaded."""
    first = loader(mapped())
    state = state_after(first, 3)
    assert state["dataset_state"]["drawn"] == 3 * BATCH and state["next_batch"] == 3
    resumed = loader(mapped())
    resumed.load_state_dict(state)
    it = iter(resumed)
    again = resumed.state_dict()
    assert again["next_batch"] == 3 and again["dataset_state"]["drawn"] == 3 * BATCH
    rest = [next(it)]
    assert rest[0] == epoch(loader(mapped()), list)[3]
    assert resumed.stats.sources == received(rest[0], "abc")
    it.close()


def test_a_failing_source_of_a_map_mix_names_source_and_item():
    made = loader(Mix({"f": Failing("f", 4)}, {"f": 1}, shuffle=False))
    with pytest.raises(KeyError, match="no item 2") as caught:
        epoch(made, list)
    assert any("sources['f'] item 2" in note for note in caught.value.__notes__)


def test_a_sources_getitems_reads_its_items_of_a_batch_in_one_call():
    batched = Batched("a", 7)
    mix = Mix({"a": batched, "b": Named("b", 5)}, {"a": 1, "b": 1}, seed=5)
    keys = list(mix.loader_sampler())
    assert mix.__getitems__(keys[:6]) == [mix[key] for key in keys[:6]]
    assert batched.calls == 1
    got = flat(epoch(loader(mix, num_workers=2), list))
    assert got == drawn(Mix({"a": Named("a", 7), "b": Named("b", 5)}, {"a": 1, "b": 1}, seed=5))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_reads_a_map_mix_through_its_sampler(workers):
    mix = mapped()
    made = DataLoader(mix, sampler=mix.loader_sampler(), batch_size=BATCH, collate_fn=list,
                      num_workers=workers)  # fmt: skip
    assert flat(made) == drawn(mapped())
    with pytest.raises(TypeError, match="loader_sampler"):
        next(iter(DataLoader(mapped(), batch_size=BATCH)))


@pytest.mark.parametrize("option", [dict(shuffle=True), dict(sampler=[-1]),
                                    dict(batch_sampler=[[-1]], batch_size=1)])  # fmt: skip
def test_a_map_mix_refuses_the_loaders_own_sampling(option):
    with pytest.raises(ValueError, match=f"{next(iter(option))}= with a dataset that supplies"):
        AsyncLoader(mapped(), **option)


def test_a_map_mix_inside_a_mix_is_read_as_an_iterable():
    """A Mix among a Mix's sources is iterated (its own order), not indexed."""
    outer = Mix({"inner": mapped(), "d": Named("d", 3)}, {"inner": 3, "d": 1}, seed=2)
    assert isinstance(outer, IterableDataset)
    out = drawn(outer)
    assert [s for s in out if s[0] != "d"] == drawn(mapped())
    assert sorted(s for s in out if s[0] == "d") == ["d0", "d1", "d2"]
