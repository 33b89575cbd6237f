"""ObjectStoreSource and s3:// shards against SeaweedFS (`weed mini`), directly and through a
fault-injecting proxy."""

from collections import Counter

import pytest
from torch.utils.data import DistributedSampler

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import ObjectStoreSource, Retry, ShardedSource
from asyncloader.sources._objectstore import tuned_options
from tests.helpers import shard_set
from tests.servers import ACCESS_KEY, SECRET_KEY, Faults, put_objects

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)


@pytest.fixture(scope="module")
def stored(seaweed):
    """40 objects under s3://testbucket/items/ and 6 shards under s3://testbucket/shards/."""
    objects = {f"items/{i:04d}.bin": f"{i:04d}".encode() * 256 for i in range(40)}
    put_objects(seaweed, objects)
    shards = shard_set(6, 10)
    put_objects(seaweed, {f"shards/{name}": data for name, data in shards.items()})
    return objects, shards


def bodies(loader):
    return [body for batch in loader for body in batch]


def proxied(options, server):
    """storage_options pointing at the fault proxy instead of SeaweedFS."""
    return options | {
        "client_kwargs": {**options["client_kwargs"], "endpoint_url": server.url("")[:-1]}
    }


def test_prefix_is_listed_sorted_and_item_i_is_the_ith_key(seaweed, stored):
    """A prefix becomes its sorted keys; item i is the bytes of key i."""
    objects, _ = stored
    source = ObjectStoreSource("s3://testbucket/items/", storage_options=seaweed.storage_options)
    assert source.targets == [f"s3://testbucket/{k}" for k in sorted(objects)]
    got = bodies(AsyncLoader(source, batch_size=8, collate_fn=list))
    assert got == [objects[k] for k in sorted(objects)]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_exactly_once_through_faults_with_distributed_sampler(
    seaweed, stored, http_server, world_size
):
    """Through a proxy injecting 20% 503s and resets, every object arrives once over all ranks."""
    objects = dict(sorted(stored[0].items())[:30])  # 30: no padding for 1, 2 or 3 ranks
    proxy = http_server({}, Faults(rates={"503": 0.2, "reset": 0.1}, seed=world_size),
                        upstream=seaweed.endpoint)  # fmt: skip
    options = proxied(seaweed.storage_options, proxy)
    keys = [f"s3://testbucket/{k}" for k in objects]
    source = ObjectStoreSource(keys, storage_options=options, retry=FAST)
    got = []
    for rank in range(world_size):
        sampler = DistributedSampler(source, num_replicas=world_size, rank=rank, seed=3)
        got += bodies(AsyncLoader(source, batch_size=4, sampler=sampler, collate_fn=list))
    assert Counter(got) == Counter(objects.values())
    faults = Counter(r.fault for r in proxy.requests)
    assert faults["503"] >= 3 and faults["reset"] >= 1, faults
    assert {r.method for r in proxy.requests} == {"GET"}, "no HEAD before a whole-object GET"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_s3_shards_exactly_once_through_faults(seaweed, stored, http_server, world_size):
    """Sharded s3:// streaming under 503s and resets: every sample once, equal counts per rank."""
    _, shards = stored
    proxy = http_server({}, Faults(rates={"503": 0.2, "reset": 0.1}, seed=world_size),
                        upstream=seaweed.endpoint)  # fmt: skip
    urls = [f"s3://testbucket/shards/{name}" for name in shards]
    got, counts = [], []
    for rank in range(world_size):
        source = ShardedSource(urls, samples_per_shard=10, rank=rank, world_size=world_size,
                               storage_options=proxied(seaweed.storage_options, proxy),
                               retry=FAST, shuffle_buffer=4)  # fmt: skip
        keys = [s["__key__"] for batch in AsyncLoader(source, batch_size=4, collate_fn=list)
                for s in batch]  # fmt: skip
        counts.append(len(keys))
        got += keys
    assert len(set(counts)) == 1
    assert Counter(got) == Counter(f"s{s:03d}-{i:04d}" for s in range(6) for i in range(10))


def test_wrong_credentials_fail_at_once_and_are_never_shown(seaweed, stored, caplog):
    """A refused signature is permanent (1 attempt); the secret is in no message or repr."""
    options = seaweed.storage_options | {"secret": "wrong-secret-value-42"}
    source = ObjectStoreSource(["s3://testbucket/items/0000.bin"], storage_options=options)
    with pytest.raises(FetchError, match="gave up after 1 attempt") as info:
        bodies(AsyncLoader(source, collate_fn=list))
    for text in (str(info.value), repr(source), caplog.text, *info.value.__notes__):
        assert "wrong-secret-value-42" not in text and SECRET_KEY not in text


def test_missing_key_is_permanent_and_size_limit_applies(seaweed, stored):
    """A missing key fails at the first attempt; an object over the limit is refused."""
    missing = ObjectStoreSource(
        ["s3://testbucket/items/nope"], storage_options=seaweed.storage_options
    )
    with pytest.raises(FetchError, match=r"nope: gave up after 1 attempt.*FileNotFoundError"):
        bodies(AsyncLoader(missing, collate_fn=list))
    small = ObjectStoreSource(["s3://testbucket/items/0000.bin"], max_object_size=100,
                              storage_options=seaweed.storage_options)  # fmt: skip
    with pytest.raises(FetchError, match="over max_object_size=100"):
        bodies(AsyncLoader(small, collate_fn=list))


def test_ranges_and_empty_objects(seaweed, stored):
    """(url, offset, length) is a ranged GET; an empty object reads as b''."""
    put_objects(seaweed, {"misc/empty": b""})
    source = ObjectStoreSource(
        [("s3://testbucket/items/0001.bin", 4, 8), "s3://testbucket/misc/empty"],
        storage_options=seaweed.storage_options,
    )
    assert bodies(AsyncLoader(source, batch_size=2, collate_fn=list)) == [b"00010001", b""]


def test_storage_options_pass_through_with_throughput_defaults():
    """The caller's options are passed unchanged; only unset s3fs defaults are added."""
    user = {"key": ACCESS_KEY, "config_kwargs": {"s3": {"addressing_style": "path"}}}
    tuned = tuned_options("s3", user, None)
    assert user == {"key": ACCESS_KEY, "config_kwargs": {"s3": {"addressing_style": "path"}}}
    assert tuned["key"] == ACCESS_KEY and tuned["max_concurrency"] == 1
    assert tuned["config_kwargs"]["s3"] == {"addressing_style": "path"}
    assert tuned["config_kwargs"]["max_pool_connections"] >= 1024
    mine = tuned_options("s3", {"config_kwargs": {"max_pool_connections": 7}}, None)
    assert mine["config_kwargs"]["max_pool_connections"] == 7
    assert tuned_options("gs", {"token": "anon"}, None) == {"token": "anon"}


def test_local_protocol_is_refused_with_a_pointer_to_file_source():
    """file:// has no async fsspec filesystem: use FileSource."""
    with pytest.raises(ValueError, match="use FileSource for local files"):
        ObjectStoreSource(["file:///tmp/x"])


@pytest.mark.parametrize(("pool", "in_flight"), [(None, range(11, 41)), (10, range(10, 11))])
def test_concurrency_is_not_capped_by_botocores_pool_of_ten(
    seaweed, stored, http_server, pool, in_flight
):
    """io_concurrency=40 puts more than 10 GETs in flight (botocore's default pool), unless
    the caller's own max_pool_connections says 10."""
    objects, _ = stored
    proxy = http_server({}, Faults(latency=0.5), upstream=seaweed.endpoint)
    keys = [f"s3://testbucket/{k}" for k in sorted(objects)]
    options = proxied(seaweed.storage_options, proxy)
    if pool is not None:
        options["config_kwargs"] = {**options["config_kwargs"], "max_pool_connections": pool}
    source = ObjectStoreSource(keys, storage_options=options)
    loader = AsyncLoader(source, batch_size=40, io_concurrency=40, collate_fn=list)
    assert bodies(loader) == [objects[k] for k in sorted(objects)]
    assert proxy.max_active in in_flight
