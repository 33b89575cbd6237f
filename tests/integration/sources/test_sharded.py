"""ShardedSource: exactly-once across ranks under faults, equal counts, resume, epochs, skips."""

import asyncio
import pickle
from collections import Counter

import pytest
import torch.distributed

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import Retry, ShardedSource
from asyncloader.sources._sharded.shardplan import plan
from tests.helpers import shard_set
from tests.servers import Faults

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)


def keys(loader):
    """The sample keys delivered (batches of sample dicts collated as lists)."""
    return [sample["txt"].decode() for batch in loader for sample in batch]


def all_keys(shards):
    return [f"s{s:03d}-{i:04d}" for s, n in enumerate(shards) for i in range(n)]


def make(urls, counts=None, **kwargs):
    opts = {"shuffle_buffer": 8, "shard_concurrency": 3, "retry": FAST, "seed": 5}
    return ShardedSource(urls, samples_per_shard=counts, **opts | kwargs)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_exactly_once_across_ranks_under_injected_faults(http_server, world_size):
    """20% 503s, resets, cut and short bodies: ranks together deliver every sample once."""
    shards = shard_set(12, 10)
    rates = {"503": 0.2, "reset": 0.05, "truncate": 0.05, "short": 0.05}
    server = http_server(shards, Faults(rates=rates, seed=world_size))
    urls = [server.url(name) for name in shards]
    got, counts = [], []
    for rank in range(world_size):
        source = make(urls, 10, rank=rank, world_size=world_size)
        delivered = keys(AsyncLoader(source, batch_size=4, collate_fn=list))
        assert len(delivered) == len(source) == 120 // world_size
        counts.append(len(delivered))
        got += delivered
    assert Counter(got) == Counter(all_keys([10] * 12))
    faults = Counter(r.fault for r in server.requests)
    assert faults["503"] >= 3 and faults["reset"] + faults["truncate"] + faults["short"] >= 1
    resumed = [r.range for r in server.requests if r.range]
    assert resumed, "a broken stream resumes with a Range read"


def test_uneven_shards_give_equal_counts_and_no_sample_twice(http_server):
    """Shards of 3..17 samples: each of 3 ranks gets total // 3, none shared, < 3 left out."""
    sizes = [3, 17, 5, 11, 8, 2, 13]
    shards = shard_set(len(sizes), sizes)
    server = http_server(shards)
    urls = [server.url(name) for name in shards]
    per_rank = [keys(AsyncLoader(make(urls, sizes, rank=r, world_size=3), collate_fn=list))
                for r in range(3)]  # fmt: skip
    assert [len(k) for k in per_rank] == [sum(sizes) // 3] * 3
    union = [k for ks in per_rank for k in ks]
    assert len(set(union)) == len(union)
    assert len(set(all_keys(sizes)) - set(union)) == sum(sizes) % 3


def test_plan_covers_every_sample_once_for_any_world_size():
    """The slices of all ranks tile the shuffled sample sequence without overlap."""
    sizes = [4, 9, 1, 7, 7, 3]
    for world in range(1, 8):
        covered = Counter()
        for rank in range(world):
            for shard, skip, take, _ in plan(sizes, 6, seed=1, epoch=2, shuffle=True,
                                             rank=rank, world_size=world):  # fmt: skip
                covered.update((shard, i) for i in range(skip, skip + take))
        assert max(covered.values()) == 1 and sum(covered.values()) == sum(sizes) // world * world


def test_shard_order_depends_on_seed_and_epoch_only():
    """set_epoch changes the order; the same seed and epoch give the same order anywhere."""
    urls = [f"/nonexistent/{i}.tar" for i in range(20)]
    a, b = make(urls, [1] * 20), make(urls, [1] * 20)
    assert a.slices() == b.slices()
    first = a.slices()
    a.set_epoch(1)
    assert a.slices() != first and sorted(a.slices()) == sorted(first)
    unshuffled = make(urls, [1] * 20, shuffle=False).slices()
    assert unshuffled == [(i, 0, 1, None) for i in range(20)]


def test_ranks_come_from_torch_distributed_when_initialised(monkeypatch):
    """Without explicit rank/world_size, torch.distributed's are used."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    source = make([f"/x/{i}.tar" for i in range(8)], [10] * 8)
    assert len(source) == 20
    pickled = pickle.dumps(source)
    explicit = make([f"/x/{i}.tar" for i in range(8)], [10] * 8, rank=1, world_size=4)
    assert source.slices() == explicit.slices()
    monkeypatch.undo()  # a worker's copy has no group to ask: it keeps the parent's place
    assert pickle.loads(pickled).slices() == explicit.slices()


def test_local_shards_samples_are_grouped_by_key(tmp_path):
    """Members sharing a basename form one sample dict with one field per extension."""
    shards = shard_set(3, 4)
    for name, data in shards.items():
        (tmp_path / name).write_bytes(data)
    source = make([str(tmp_path / name) for name in shards], shuffle=False, shard_concurrency=1)
    samples = [s for batch in AsyncLoader(source, batch_size=5, collate_fn=list) for s in batch]
    assert [s["__key__"] for s in samples] == all_keys([4] * 3)
    assert all(set(s) == {"__key__", "__url__", "txt", "bin"} for s in samples)


def test_a_short_shard_is_retried_and_resumed_not_returned(http_server):
    """A body cut mid-member (consistent Content-Length) is detected and resumed by Range."""
    shards = shard_set(1, 20)
    name = next(iter(shards))
    server = http_server(shards, Faults(script={name: ["short", "short"]}))
    got = keys(AsyncLoader(make([server.url(name)], [20]), collate_fn=list))
    assert sorted(got) == all_keys([20])
    ranges = [r.range for r in server.requests]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:])


def test_a_shard_with_fewer_samples_than_declared_raises(http_server):
    """samples_per_shard larger than the truth raises FetchError naming the shard."""
    shards = shard_set(1, 5)
    server = http_server(shards)
    url = server.url(next(iter(shards)))
    with pytest.raises(FetchError, match=r"holds 5 samples, fewer than samples_per_shard"):
        keys(AsyncLoader(make([url], [6]), collate_fn=list))


def test_a_shard_with_more_samples_than_declared_raises_instead_of_dropping(http_server):
    """Samples beyond samples_per_shard would reach no rank: FetchError, not silence."""
    shards = shard_set(2, 6)
    server = http_server(shards)
    urls = [server.url(name) for name in shards]
    with pytest.raises(FetchError, match="holds more than 5 samples"):
        keys(AsyncLoader(make(urls, 5, rank=1, world_size=2), collate_fn=list))


def test_failed_shard_skip_counts_its_samples(http_server):
    """on_error='skip': a shard that fails for good is skipped and its samples counted."""
    shards = shard_set(3, 4)
    server = http_server(shards, Faults(script={"shard-00001.tar": ["404"]}))
    source = make([server.url(n) for n in shards], 4, on_error="skip", max_skipped=4)
    got = keys(AsyncLoader(source, collate_fn=list))
    assert sorted(got) == [k for k in all_keys([4, 4, 4]) if not k.startswith("s001")]
    assert source.skipped == 4 and "HTTP 404" in source.skip_log[0]


def test_decode_errors_raise_as_themselves_by_default(tmp_path):
    """A decode hook's exception reaches the consumer with its own type."""
    (tmp_path / "a.tar").write_bytes(shard_set(1, 3)["shard-00000.tar"])

    def decode(sample):
        raise KeyError("cls")

    with pytest.raises(KeyError):
        keys(AsyncLoader(make([str(tmp_path / "a.tar")], decode=decode), collate_fn=list))


def test_breaking_out_cancels_the_readers(http_server):
    """Leaving the epoch early stops every shard reader (nothing left running)."""
    shards = shard_set(6, 50)
    server = http_server(shards, Faults(latency=0.01))
    source = make([server.url(n) for n in shards], 50)

    async def run():
        async with AsyncLoader(source, batch_size=4, collate_fn=list) as loader:
            async for _ in loader:
                break
        others = asyncio.all_tasks() - {asyncio.current_task()}
        return {t.get_name() for t in others}

    assert asyncio.run(run()) == set()


@pytest.mark.parametrize("workers", [0, 2])
def test_without_counts_ranks_count_the_shards_and_split_them_evenly(http_server, workers):
    """Uneven shards, no samples_per_shard: every rank counts, then takes an equal share."""
    shards = shard_set(5, [7, 1, 12, 4, 9])  # 33 samples: 11 per rank of 3
    server = http_server(shards)
    urls = [server.url(name) for name in shards]
    got = []
    for rank in range(3):
        source = make(urls, rank=rank, world_size=3)
        options = {"num_workers": workers, "fetch_in_workers": bool(workers)}
        got.append(keys(AsyncLoader(source, batch_size=4, collate_fn=list, **options)))
    assert [len(k) for k in got] == [11, 11, 11]
    assert sorted(k for rank in got for k in rank) == all_keys([7, 1, 12, 4, 9])
    counted = make(urls)
    assert asyncio.run(counted.count_samples()) == [7, 1, 12, 4, 9] and len(counted) == 33


def test_world_size_above_one_needs_counts_and_options_are_checked():
    """Splitting across ranks before counting, and bad options, fail clearly."""
    source = ShardedSource(["/x/0.tar", "/x/1.tar"], rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"samples_per_shard \(or count_samples\(\)\) is needed"):
        source.slices()
    with pytest.raises(ValueError, match="rank=2 must be in"):
        ShardedSource(["/x/0.tar"], rank=2, world_size=2)
    with pytest.raises(ValueError, match="on_error='skip' needs samples_per_shard"):
        ShardedSource(["/x/0.tar"], on_error="skip", max_skipped=1)
    with pytest.raises(ValueError, match="shuffle_buffer=0 must be >= 1"):
        ShardedSource(["/x/0.tar"], shuffle_buffer=0)
    with pytest.raises(ValueError, match="samples_per_shard has 1 counts for 2 shards"):
        ShardedSource(["/x/0.tar", "/x/1.tar"], samples_per_shard=[3])
