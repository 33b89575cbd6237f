"""ShardedSource's sample counts: one int over a shard set whose last shard is short (as
``webdataset.ShardWriter(maxcount=...)`` leaves it), and the error for counts that are wrong."""

import asyncio
import json
import pickle

import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import Retry, ShardedSource
from tests.helpers import shard_set
from tests.helpers.contracts import check_exactly_once, check_resume, epoch
from tests.helpers.sources import jitter

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)
PER_SHARD = 6
SIZES = [6, 6, 6, 6, 2]  # 26 samples written 6 to a shard: the last one short
PLACEMENTS = [
    pytest.param({}, id="workers=0"),
    pytest.param({"num_workers": 2, "transform": jitter}, id="workers=2"),
    pytest.param({"num_workers": 2, "fetch_in_workers": True}, id="fetch-in-workers"),
]


def all_keys(sizes):
    return [f"s{s:03d}-{i:04d}" for s, n in enumerate(sizes) for i in range(n)]


def batch_keys(batch):
    return [sample["__key__"] for sample in batch]


def make(urls, counts=PER_SHARD, **kwargs):
    opts = {"shuffle_buffer": 8, "shard_concurrency": 3, "retry": FAST, "seed": 5}
    return ShardedSource(urls, samples_per_shard=counts, **opts | kwargs)


@pytest.fixture
def served(http_server):
    """The shard set of SIZES over HTTP: the server and the shards' URLs."""
    shards = shard_set(len(SIZES), SIZES)
    server = http_server(shards)
    return server, [server.url(name) for name in shards]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_one_int_count_takes_a_short_last_shard_once_and_resumes(served, placement):
    """samples_per_shard=6 over shards of 6 and a last one of 2: every sample comes once, and
    a checkpoint mid-epoch (mid-shard) resumes with the uninterrupted epoch's batches."""
    _, urls = served

    def make_loader(**kw):
        return AsyncLoader(make(urls), batch_size=4, collate_fn=list, **placement | kw)

    check_exactly_once(epoch(make_loader(), batch_keys), all_keys(SIZES))
    check_resume(make_loader, [3] if placement else [0, 1, 3, 6, 7], key=batch_keys)


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_int_count_with_a_short_last_shard_splits_ranks_evenly(served, world_size):
    """Each rank counts the last shard, then takes total // world_size samples, none shared
    and fewer than world_size left out; every rank's len() afterwards says how many."""
    _, urls = served
    got, sources = [], []
    for rank in range(world_size):
        source = make(urls, rank=rank, world_size=world_size)
        got.append([k for batch in AsyncLoader(source, collate_fn=list) for k in batch_keys(batch)])
        sources.append(source)
    assert [len(k) for k in got] == [sum(SIZES) // world_size] * world_size
    assert [len(s) for s in sources] == [sum(SIZES) // world_size] * world_size
    union = [k for keys in got for k in keys]
    assert len(set(union)) == len(union)
    assert len(set(all_keys(SIZES)) - set(union)) == sum(SIZES) % world_size


def test_counting_with_one_int_reads_only_the_last_shard(served):
    """Before counting, len() is an upper bound (the last shard taken as full) and slices()
    asks for the count; count_samples() reads the last shard alone, and a copy keeps it."""
    server, urls = served
    source = make(urls, rank=0, world_size=2)
    assert len(source) == len(SIZES) * PER_SHARD // 2
    with pytest.raises(ValueError, match=r"await count_samples\(\) first"):
        source.slices()
    assert asyncio.run(source.count_samples()) == SIZES
    assert [r.path for r in server.requests] == ["shard-00004.tar"]
    assert len(source) == sum(SIZES) // 2 and source.slices()
    copy = pickle.loads(pickle.dumps(source))  # as a worker gets it: counted, nothing to read
    assert len(copy) == len(source) and copy.slices() == source.slices()


async def _take(source, n=None):
    it, out = aiter(source), []
    try:
        async for sample in it:
            out.append(sample["__key__"])
            if len(out) == n:
                break
    finally:
        await it.aclose()
    return out, json.loads(json.dumps(source.state_dict()))


def test_one_int_count_resumes_at_another_world_size(served):
    """Cut mid-epoch at 2 ranks, resumed at 3: the new ranks split what was left (the last
    shard counted first), equal counts, no sample twice, fewer than 3 left out."""
    _, urls = served
    taken, states = [], []
    for rank in range(2):
        keys, state = asyncio.run(_take(make(urls, rank=rank, world_size=2), 5))
        taken += keys
        states.append(state)
    rest = []
    for rank in range(3):
        source = make(urls, rank=rank, world_size=3)
        source.load_state_dict(states[rank % 2])  # any rank's state, at another world size
        rest.append(asyncio.run(_take(source))[0])
    union = taken + [k for keys in rest for k in keys]
    assert len(set(union)) == len(union)
    assert len({len(keys) for keys in rest}) == 1
    assert len(set(all_keys(SIZES)) - set(union)) == (sum(SIZES) - len(taken)) % 3


def test_a_wrong_count_names_the_shard_the_counts_and_the_fix(http_server):
    """One int: a shard before the last holding fewer, or the last holding more, raises
    FetchError naming the shard, both counts, and how to pass them (a list, count_samples)."""
    for sizes, wrong in (([6, 2, 6], "holds 2 samples, fewer than samples_per_shard says (6)"),
                         ([6, 6, 7], "holds more than 6 samples")):  # fmt: skip
        shards = shard_set(len(sizes), sizes)
        server = http_server(shards)
        urls = [server.url(name) for name in shards]
        bad = sizes.index(2) if 2 in sizes else len(sizes) - 1
        with pytest.raises(FetchError) as caught:
            list(AsyncLoader(make(urls, shuffle=False), collate_fn=list))
        message = str(caught.value)
        assert f"shard-{bad:05d}.tar" in message and f"shard_urls[{bad}] {wrong}" in message
        assert "samples_per_shard=[" in message and "count_samples()" in message
