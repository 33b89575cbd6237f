"""ShardedSource resumed mid-epoch at another world size (elastic): the new ranks split what
the old ranks' streams had left, each sample once, every rank the same number of steps, and
the next epoch is a fresh job's. Ranks are simulated in one process with rank= and
world_size=; a worker's part with ``as_worker`` (source tests) or real workers (loader tests)."""

import asyncio
import contextlib
import json
from collections import Counter

import pytest

from asyncloader import AsyncLoader
from asyncloader.sources import Retry, ShardedSource
from tests.helpers import as_worker, shard_set
from tests.servers import Faults

pytestmark = pytest.mark.timeout(90)

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)
SIZES = [7, 12, 5, 9, 3, 6, 6]  # 48 samples: whole for 1, 2, 3, 4 ranks
ALL = sorted(f"s{s:03d}-{i:04d}" for s, n in enumerate(SIZES) for i in range(n))


@pytest.fixture
def paths(tmp_path):
    out = []
    for name, data in shard_set(len(SIZES), SIZES).items():
        (tmp_path / name).write_bytes(data)
        out.append(str(tmp_path / name))
    return out


def make(paths, rank, world, counts=SIZES, **kwargs):
    opts = {"shuffle_buffer": 6, "shard_concurrency": 3, "retry": FAST, "seed": 7}
    return ShardedSource(
        paths, samples_per_shard=counts, rank=rank, world_size=world, **opts | kwargs
    )


def in_worker(worker, workers):
    return as_worker(worker, workers) if workers > 1 else contextlib.nullcontext()


async def _keys(source, n):
    it = aiter(source)
    out = []
    try:
        while n is None or len(out) < n:
            try:
                out.append((await anext(it))["__key__"])
            except StopAsyncIteration:
                break
    finally:
        await it.aclose()
    return out


def stream(source, worker=0, workers=1, n=None, state=None):
    """The keys of the first ``n`` samples (all without ``n``) of worker ``worker``'s part,
    after loading ``state``; and the state then (through JSON)."""
    with in_worker(worker, workers):
        if state is not None:
            source.load_state_dict(state)
        keys = asyncio.run(_keys(source, n))
        return keys, json.loads(json.dumps(source.state_dict()))


def stopped(paths, world, workers, took, epoch=1, **kwargs):
    """Every rank of ``world`` (each worker ``w`` of ``workers``) hands out ``took(part, w)``
    samples of ``epoch``: the keys taken, and rank 0's streams' states."""
    taken, states = [], None
    for rank in range(world):
        parts = []
        for w in range(workers):
            source = make(paths, rank, world, **kwargs)
            source.set_epoch(epoch)
            part = len(stream(source, w, workers)[0])
            source.set_epoch(epoch)
            keys, state = stream(source, w, workers, took(part, w))
            taken += keys
            parts.append(state)
        states = states or parts
    return taken, states


def resumed(paths, world, workers, states, **kwargs):
    """rank -> worker -> the keys each new stream hands out after the cut of ``states``."""
    out = []
    for rank in range(world):
        cut = make(paths, rank, world, **kwargs).elastic_state(states)
        out.append([stream(make(paths, rank, world, **kwargs), w, workers, state=cut)[0]
                    for w in range(workers)])  # fmt: skip
    return out


def some(part, w):
    """A different position for each worker, the same on every rank."""
    return part * (w + 1) // 3


@pytest.mark.parametrize(
    ("old", "new"), [((4, 1), (2, 1)), ((4, 2), (3, 2)), ((2, 2), (5, 3)), ((3, 2), (1, 1))]
)
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("counts", [SIZES, None])
def test_a_cut_gives_the_new_streams_what_the_old_ones_left(paths, old, new, shuffle, counts):
    """(ranks, workers) before and after: the new ranks' streams hand out exactly what the
    old streams had not, each once but for a dropped tail (fewer than the new ranks), every
    new rank the same count, and each new worker the same count on every rank."""
    kwargs = {"shuffle": shuffle, "counts": counts}
    taken, states = stopped(paths, *old, some, **kwargs)
    after = resumed(paths, *new, states, **kwargs)
    rest = [k for rank in after for part in rank for k in part]
    assert max(Counter(taken + rest).values()) == 1
    left = len(ALL) - len(taken)
    assert len(set(ALL) - set(taken + rest)) == left % new[0]
    assert len({tuple(len(part) for part in rank) for rank in after}) == 1


@pytest.mark.parametrize(("old", "new"), [(4, 3), (2, 5)])
def test_a_padded_tail_gives_every_sample_left_at_least_once(paths, old, new):
    """distributed_tail="pad": the remainder is extended by repeating its head to equal
    shares; every sample left comes, fewer than the new ranks twice."""
    taken, states = stopped(paths, old, 1, lambda part, _: 5, distributed_tail="pad")
    after = resumed(paths, new, 1, states, distributed_tail="pad")
    rest = [k for rank in after for k in rank[0]]
    assert set(taken + rest) == set(ALL) and not set(taken) & set(rest)
    assert len(rest) == -(-(len(ALL) - len(taken)) // new) * new
    assert len({len(rank[0]) for rank in after}) == 1


def test_a_padded_epoch_gives_every_sample_with_equal_ranks(paths):
    """distributed_tail="pad" in a whole epoch: 48 samples at 5 ranks, 10 each, 2 repeated."""
    got = [stream(make(paths, r, 5, distributed_tail="pad"))[0] for r in range(5)]
    assert {len(g) for g in got} == {10} and {k for g in got for k in g} == set(ALL)
    assert len(make(paths, 0, 5, distributed_tail="pad")) == 10


def test_any_old_ranks_streams_give_the_same_cut(paths):
    """The old ranks' streams stand at the same places: a state from any rank cuts alike."""
    per_rank = []
    for rank in range(3):
        states = []
        for w in range(2):
            source = make(paths, rank, 3)
            states.append(stream(source, w, 2, 3 + w)[1])
        per_rank.append(states)
    cuts = [make(paths, 1, 2).elastic_state(states) for states in per_rank]
    assert cuts[0] == cuts[1] == cuts[2]
    assert cuts[0]["world_size"] == 2 and cuts[0]["rank"] == 1


def test_after_a_cut_a_resume_at_the_same_size_is_exact(paths):
    """Interrupted again at the new size, the same size continues batch for batch."""
    _, states = stopped(paths, 4, 2, some)
    cut = make(paths, 1, 3).elastic_state(states)
    whole, _ = stream(make(paths, 1, 3), 1, 2, state=cut)
    for n in (0, 1, len(whole) // 2, len(whole)):
        head, state = stream(make(paths, 1, 3), 1, 2, n, state=cut)
        assert state["yielded"] == n and len(state["history"]) == 1
        assert head + stream(make(paths, 1, 3), 1, 2, state=state)[0] == whole


def test_two_cuts_in_a_row_leave_each_sample_once(paths):
    """4 ranks, then 3 (each a different place), then 2: the second cut cuts the remainder."""
    taken, states = stopped(paths, 4, 2, some)
    second = []
    for rank in range(3):
        cut = make(paths, rank, 3).elastic_state(states)
        parts = [stream(make(paths, rank, 3), w, 2, 2 + w, state=cut) for w in range(2)]
        taken += [k for keys, _ in parts for k in keys]
        second = second or [state for _, state in parts]
    assert [len(s["history"]) for s in second] == [1, 1]
    after = resumed(paths, 2, 2, second)
    rest = [k for rank in after for part in rank for k in part]
    assert max(Counter(taken + rest).values()) == 1
    assert len(set(ALL) - set(taken + rest)) == (len(ALL) - len(taken)) % 2


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_a_cut_after_the_last_sample_leaves_nothing(paths, tail):
    """Every old stream had handed out all its samples: the new ranks' rest is empty."""
    taken, states = stopped(paths, 3, 2, lambda part, _: part, distributed_tail=tail)
    assert sorted(taken) == ALL
    assert resumed(paths, 2, 2, states, distributed_tail=tail) == [[[], []], [[], []]]


def test_a_states_set_epoch_starts_the_whole_epoch_of_the_new_size(paths):
    """After a cut, set_epoch(next) is what a fresh job at the new size has."""
    _, states = stopped(paths, 4, 1, some)
    source = make(paths, 2, 3)
    source.load_state_dict(source.elastic_state(states))
    stream(source)
    source.set_epoch(2)
    fresh = make(paths, 2, 3)
    fresh.set_epoch(2)
    assert stream(source)[0] == stream(fresh)[0]


def test_a_state_without_the_new_fields_cuts_at_another_size(paths):
    """A single stream's state saved before history and distributed_tail existed: loaded at
    another world size, it is cut like a new one."""
    taken, states = stopped(paths, 2, 1, lambda part, _: 8)
    old = {k: v for k, v in states[0].items() if k not in ("history", "distributed_tail")}
    rest = []
    for rank in range(4):
        rest += stream(make(paths, rank, 4), state=old)[0]
    assert sorted(taken + rest) == ALL


def test_only_the_read_past_samples_are_undecoded(paths):
    """A new stream decodes only its own samples: the others of a shard are read past."""
    _, states = stopped(paths, 4, 1, some)
    decoded = []

    def decode(sample):
        decoded.append(sample["__key__"])
        return sample

    source = make(paths, 0, 2, decode=decode)
    keys, _ = stream(source, state=source.elastic_state(states))
    assert sorted(decoded) == sorted(keys)


def test_a_cut_read_over_http_with_faults_gives_the_same_samples(paths, http_server):
    """Over HTTP with 503s and resets mid-shard, the new streams' reads of picked samples
    resume where they broke: the same samples as from files."""
    _, states = stopped(paths, 4, 2, some)
    shards = shard_set(len(SIZES), SIZES)
    server = http_server(shards, Faults(rates={"503": 0.2, "reset": 0.1}, seed=3))
    urls = [server.url(name) for name in shards]
    assert resumed(urls, 3, 2, states) == resumed(paths, 3, 2, states)
    faults = {r.fault for r in server.requests}
    assert {"503", "reset"} <= faults, faults


def test_a_lone_workers_state_at_another_size_is_refused(paths):
    """One worker's state does not say where its rank's other workers were."""
    _, states = stopped(paths, 2, 2, some)
    with in_worker(0, 2), pytest.raises(ValueError, match="its rank's other workers"):
        make(paths, 0, 3).load_state_dict(states[0])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epoch": 3}, "epoch"),
        ({"world_size": 3}, "world_size"),
        ({"yielded": 99}, "yielded=99"),
    ],
)
def test_streams_states_that_disagree_are_refused(paths, change, match):
    """Checked when the cut is made, or (a position past its stream's end) when the new
    stream starts."""
    _, states = stopped(paths, 2, 2, some)
    with pytest.raises(ValueError, match=match):
        cut = make(paths, 0, 3).elastic_state([states[0], {**states[1], **change}])
        stream(make(paths, 0, 3), state=cut)


def test_distributed_tail_is_checked(paths):
    with pytest.raises(ValueError, match="distributed_tail must be 'pad' or 'drop', got 'wrap'"):
        make(paths, 0, 1, distributed_tail="wrap")


# Through the loader, with real workers.


def loader(paths, rank, world, workers=0, **kwargs):
    return AsyncLoader(
        make(paths, None, None, **kwargs),
        batch_size=2,
        collate_fn=list,
        distributed=True,
        rank=rank,
        world_size=world,
        num_workers=workers,
        fetch_in_workers=bool(workers),
    )


def keys(batch):
    return [s["__key__"] for s in batch]


def interrupted(make_loader, world, steps):
    """Every rank of ``world`` runs epoch 0, then takes ``steps`` batches of epoch 1: the
    keys taken, and rank 0's state (through JSON)."""
    taken, state = [], None
    for rank in range(world):
        with contextlib.closing(make_loader(rank, world)) as ld:
            list(ld)
            it = iter(ld)
            for _ in range(steps):
                taken += keys(next(it))
            state = state or json.loads(json.dumps(ld.state_dict()))
            it.close()
    return taken, state


def epochs(make_loader, world, n, state=None):
    """rank -> epoch -> batches of ``n`` epochs (after loading ``state``)."""
    out = []
    for rank in range(world):
        with contextlib.closing(make_loader(rank, world)) as ld:
            if state is not None:
                ld.load_state_dict(state)
            out.append([[keys(b) for b in ld] for _ in range(n)])
    return out


@pytest.mark.parametrize(
    ("old", "new", "steps", "workers", "shuffle", "counts"),
    [
        (4, 2, 3, 0, True, SIZES),
        (4, 3, 3, 0, False, None),
        (2, 5, 2, 0, True, None),
        (2, 5, 2, 0, False, SIZES),
        (4, 2, 3, 2, True, None),
        (4, 3, 3, 2, True, SIZES),
        (2, 5, 2, 2, False, SIZES),
    ],
)
def test_elastic_resume_through_the_loader_gives_what_was_left_each_once(
    paths, old, new, steps, workers, shuffle, counts
):
    """Sizes where the remainder splits evenly: old ranks' batches and the new ranks' are the
    epoch once, every new rank makes the same steps, and the next epoch is a fresh job's."""

    def make_loader(rank, world):
        return loader(paths, rank, world, workers, shuffle=shuffle, counts=counts)

    taken, state = interrupted(make_loader, old, steps)
    after = epochs(make_loader, new, 2, state)
    rest = [k for rank in after for b in rank[0] for k in b]
    assert sorted(taken + rest) == ALL
    assert len({len(rank[0]) for rank in after}) == 1
    fresh = epochs(make_loader, new, 3)
    assert [rank[1] for rank in after] == [rank[2] for rank in fresh]


@pytest.mark.parametrize("workers", [0, 2])
def test_two_elastic_resumes_through_the_loader(paths, workers):
    """4 ranks, then 3, then 2: each sample once; at 3, a resume at 3 is batch for batch."""

    def make_loader(rank, world):
        return loader(paths, rank, world, workers)

    taken, state = interrupted(make_loader, 4, 3)
    loaders = [make_loader(rank, 3) for rank in range(3)]
    try:
        for ld in loaders:
            ld.load_state_dict(state)
        its = [iter(ld) for ld in loaders]
        for it in its:
            taken += keys(next(it)) + keys(next(it))
        second = json.loads(json.dumps(loaders[1].state_dict()))
        rest_at_3 = [[keys(b) for b in it] for it in its]
    finally:
        for ld in loaders:
            ld.close()
    assert [rank[0] for rank in epochs(make_loader, 3, 1, second)] == rest_at_3
    rest = [k for rank in epochs(make_loader, 2, 1, second) for b in rank[0] for k in b]
    assert sorted(taken + rest) == ALL


def test_elastic_resume_may_change_the_placement(paths):
    """Saved by 4 ranks iterating in 2 workers each, resumed by 2 ranks iterating in this
    process: the position is the rank's, not the workers'."""
    taken, state = interrupted(lambda r, w: loader(paths, r, w, 2), 4, 3)
    rest = [k for rank in epochs(lambda r, w: loader(paths, r, w), 2, 1, state)
            for b in rank[0] for k in b]  # fmt: skip
    assert sorted(taken + rest) == ALL


@pytest.mark.parametrize("workers", [0, 2])
def test_between_epochs_a_state_moves_to_another_world_size(paths, workers):
    """A state saved after an epoch's end at 2 ranks: at 3, the next epoch is a fresh job's."""
    with contextlib.closing(loader(paths, 0, 2, workers)) as ld:
        list(ld)
        state = json.loads(json.dumps(ld.state_dict()))
    after = epochs(lambda r, w: loader(paths, r, w, workers), 3, 1, state)
    fresh = epochs(lambda r, w: loader(paths, r, w, workers), 3, 2)
    assert [rank[0] for rank in after] == [rank[1] for rank in fresh]


def test_an_out_of_order_position_does_not_move_to_another_world_size(paths):
    _, state = interrupted(lambda r, w: loader(paths, r, w), 2, 1)
    with (
        contextlib.closing(loader(paths, 0, 3)) as ld,
        pytest.raises(ValueError, match="in_order=True"),
    ):
        ld.load_state_dict({**state, "delivered_beyond": [3]})


def test_a_loader_state_from_before_moves_only_without_workers(paths):
    """A state without the loader's "distributed" record (saved before it): a single stream
    per rank moves; one worker's stream of several cannot, and says so at the first batch."""
    taken, state = interrupted(lambda r, w: loader(paths, r, w), 4, 3)
    del state["distributed"]
    rest = [k for rank in epochs(lambda r, w: loader(paths, r, w), 2, 1, state)
            for b in rank[0] for k in b]  # fmt: skip
    assert sorted(taken + rest) == ALL
    _, state = interrupted(lambda r, w: loader(paths, r, w, 2), 4, 3)
    del state["distributed"]
    with pytest.raises(ValueError, match="its rank's other workers"):
        epochs(lambda r, w: loader(paths, r, w, 2), 2, 1, state)
