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
from collections import Counter

import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader.sources import Mix, ShardedSource
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


@pytest.fixture
def shards(tmp_path):
    paths = []
    for name, data in shard_set(len(SIZES), SIZES).items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    return paths


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


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_loader_resumes_at_every_position(placement, asynchronous):
    """The contract checker over Mix: stopped after any k batches, resumed in a new loader,
    the same batches follow; the mix is the one iterated alone, for any num_workers."""
    make = lambda **kw: loader(mixed(asynchronous=asynchronous), **placement | kw)  # noqa: E731
    check_order(epoch(make(), list), drawn(mixed()))
    check_resume(make, key=list)


def test_the_loader_resumes_a_never_mix_across_epochs():
    """distributed=True tells the epochs: states between and inside epochs continue exactly
    (the sources going on from where the epoch before left them)."""
    make = lambda: loader(mixed("never"), distributed=True, rank=0, world_size=1)  # noqa: E731
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
        assert run.stats.sources == received(got)
    return got


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("stop", ["all_exhausted", "never"])
def test_loader_stats_count_each_sources_samples_received(shards, placement, stop):
    """loader.stats.sources after every batch and at the epoch's end: the samples received
    of each source, though the Mix has drawn ahead of them (a held consumer lets it); in a
    resumed epoch, those received since the resume (as stats.samples)."""
    make = lambda: loader(mixed(stop, stop == "never", shards), **placement)  # noqa: E731
    run = make()
    it = iter(run)
    assert run.stats.sources == received([])
    got = list(next(it))
    wait_event(ran_ahead(run), "the Mix to draw ahead of a held consumer")
    assert sum(run.dataset.counts.values()) > len(got) == sum(run.stats.sources.values())
    got, stats = counted(run, it, got), run.stats
    logged = {n[len("sources/") :]: v for n, v in stats.as_dict().items() if "/" in n}
    assert stats.sources == logged == received(got)
    assert f"a {received(got)['a']} (" in run.report()
    again = flat(epoch(run, list))  # the next epoch counts its own
    assert run.stats.sources == received(again) and run.previous_stats.sources == stats.sources
    stopped = make()
    it = iter(stopped)
    seen = flat(next(it) for _ in range(3))
    state = json.loads(json.dumps(stopped.state_dict()))
    it.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = counted(resumed, iter(resumed), [])
    assert seen + rest == got and resumed.stats.samples == len(rest)


def test_fetch_in_workers_is_refused_naming_it():
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


def test_draws_in_the_workers_repeat():
    """A transform's random draws in the workers repeat with the generator's seed, for 1
    or 2 workers (the mix itself is the Mix's seed's)."""

    def make(num_workers, seed):
        generator = torch.Generator().manual_seed(seed)
        return loader(mixed(), num_workers=num_workers, transform=Draws(), generator=generator)

    check_repeatable(make, list)


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_clean_shutdown(placement, stop):
    check_clean_shutdown(loader(mixed(asynchronous=True), **placement), stop)


# -- ranks ----------------------------------------------------------------------------------


def ranked(shards, rank, world, stop="all_exhausted", **kw) -> AsyncLoader:
    """A loader of rank ``rank`` of ``world`` over two map-style sources and the shards."""
    opts = dict(samples_per_shard=SIZES, shuffle_buffer=4, seed=1, decode=key_of)
    sources = {"a": Named("a", 8), "b": Named("b", 6), "t": ShardedSource(shards, **opts)}
    more = {"samples_per_epoch": 20} if stop == "never" else {}
    mix = Mix(sources, {"a": 1, "b": 2, "t": 2}, seed=5, stop=stop, distributed_tail="drop",
              **more)  # fmt: skip
    return loader(mix, distributed=True, rank=rank, world_size=world, **kw)


ALL = [f"a{i}" for i in range(8)] + [f"b{i}" for i in range(6)] + [
    f"s{s:03d}-{i:04d}" for s, n in enumerate(SIZES) for i in range(n)]  # fmt: skip


def check_left_once(got: list, world: int) -> None:
    """Every sample at most once, and of each source fewer than ``world`` left out (the
    drop tail of a split that does not divide)."""
    counts = Counter(got)
    assert max(counts.values()) == 1, [s for s, n in counts.items() if n > 1]
    missing = Counter(source_of(s) for s in set(ALL) - set(counts))
    assert all(n < world for n in missing.values()), missing
    assert set(counts) <= set(ALL)


def test_ranks_draw_the_same_sources_and_split_each_source(shards):
    """Every rank draws the same sequence of sources; each source is split across ranks as
    it is alone (map-style by rows, the shards by the sharded source's rule): every sample
    once in the job."""
    runs = [flat(epoch(ranked(shards, r, 2), list)) for r in range(2)]
    assert [source_of(s) for s in runs[0]] == [source_of(s) for s in runs[1]]
    check_exactly_once([runs[0] + runs[1]], ALL)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_two_ranks_resume_at_every_position(shards, placement):
    """Rank 0's state after k steps continues both ranks (a new loader each) exactly."""
    reference = [epoch(ranked(shards, r, 2, **placement), list) for r in range(2)]
    points = range(len(reference[0]) + 1) if not placement else (0, 2, len(reference[0]))
    for k in points:
        first = ranked(shards, 0, 2, **placement)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        it.close()
        for rank in range(2):
            resumed = ranked(shards, rank, 2, **placement)
            resumed.load_state_dict(state)
            assert epoch(resumed, list) == reference[rank][k:], (k, rank)


def stopped(shards, world, k, stop="all_exhausted"):
    """Every rank of ``world`` after ``k`` steps: the samples they gave, rank 0's state."""
    runs = [ranked(shards, r, world, stop) for r in range(world)]
    its = [iter(run) for run in runs]
    before = [s for it in its for _ in range(k) for s in next(it)]
    state = json.loads(json.dumps(runs[0].state_dict()))
    for it in its:
        it.close()
    return before, state


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2)])
def test_a_resume_at_another_world_size_gives_each_sample_left_once(shards, old, new):
    """All ranks of ``old`` stop after k steps; ``new`` ranks load rank 0's state: what they
    give is what the old ranks had not, each once (fewer than ``new`` of a source left out
    where its remainder does not divide); with ``"never"`` the sources drawn after the cut
    are the uninterrupted run's (the draws do not depend on the world size)."""
    steps = len(epoch(ranked(shards, 0, old), list))
    for k in (1, steps // 2, steps - 1):
        before, state = stopped(shards, old, k)
        after = []
        for r in range(new):
            resumed = ranked(shards, r, new)
            resumed.load_state_dict(state)
            after += flat(epoch(resumed, list))
        check_left_once(before + after, new)
    before, state = stopped(shards, old, 2, "never")
    resumed = ranked(shards, 0, new, "never")
    resumed.load_state_dict(state)
    whole = flat(epoch(ranked(shards, 0, old, "never"), list))
    assert [source_of(s) for s in before[: 2 * BATCH] + flat(epoch(resumed, list))] == [
        source_of(s) for s in whole]  # fmt: skip
