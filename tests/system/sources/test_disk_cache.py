"""The disk cache where it meets other processes and stores: a torchrun job whose ranks
and workers download each shard once, and SeaweedFS objects and shards cold then warm (the
rest: tests/integration/sources/test_disk_cache.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from asyncloader import AsyncLoader
from asyncloader.sources import DiskCache, ObjectStoreSource
from tests.helpers.contracts import check_order, epoch
from tests.integration.sources.test_disk_cache import (
    ALL_KEYS,
    BATCH,
    BIG,
    CACHE_JOB,
    FAST,
    ITEMS,
    NAMES,
    SHARD_SIZES,
    SHARDS,
    flat_keys,
    generator,
    gets,
    ids,
    keys,
    map_order,
    sharded,
    sharded_loader,
)
from tests.servers import BUCKET, Faults, FaultyHTTPServer, put_objects


@pytest.mark.timeout(240)  # as tests/system/test_torchrun.py: the job's own limit is 150 s
def test_two_ranks_and_their_workers_download_each_shard_once(tmp_path):
    """torchrun, 2 ranks x 2 fetching workers on one cache directory, every process wanting
    every shard at once: each shard is requested once; then a distributed epoch, all hits."""
    from tests.system.test_torchrun import torchrun

    with FaultyHTTPServer(SHARDS, Faults(latency=0.1)) as server:
        (tmp_path / "urls.json").write_text(json.dumps([server.url(n) for n in SHARDS]))
        (tmp_path / "counts.json").write_text(json.dumps(SHARD_SIZES))
        args = ["--urls", tmp_path / "urls.json", "--counts", tmp_path / "counts.json"]
        args += ["--cache", tmp_path / "cache", "--out", tmp_path]
        job = torchrun(2, *map(str, args), script=CACHE_JOB)
        assert job.returncode == 0, job.stdout
        assert gets(server) == Counter(NAMES), job.stdout
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert sorted(zero["whole"]) == sorted(one["whole"]) == ALL_KEYS
    assert sorted(zero["share"] + one["share"]) == ALL_KEYS
    assert max(zero["stats"]["misses"], one["stats"]["misses"]) <= len(SHARDS)


def test_object_store_items_and_shards_cold_then_warm(tmp_path, seaweed):
    """s3:// objects and shards (through a proxy that counts requests): each fetched once,
    then read from the cache with no request, in the same order."""
    put_objects(seaweed, {f"cache/{name}": data for name, data in (ITEMS | SHARDS).items()})
    with FaultyHTTPServer({}, upstream=seaweed.endpoint) as proxy:
        options = seaweed.storage_options
        endpoint = {"endpoint_url": proxy.url("")[:-1]}
        options |= {"client_kwargs": options["client_kwargs"] | endpoint}
        items = [f"s3://{BUCKET}/cache/{name}" for name in ITEMS]
        shards = [f"s3://{BUCKET}/cache/{name}" for name in SHARDS]

        def run() -> tuple[list[str], Counter, DiskCache]:
            proxy.requests.clear()
            cache = DiskCache(tmp_path, max_bytes=BIG)
            store = ObjectStoreSource(items, storage_options=options, retry=FAST, cache=cache)
            loader = AsyncLoader(store, batch_size=BATCH, shuffle=True, generator=generator(),
                                 collate_fn=list)  # fmt: skip
            check_order(epoch(loader, ids), map_order())
            stream = sharded(shards, None, storage_options=options, cache=cache)
            return flat_keys(epoch(sharded_loader(stream), keys)), gets(proxy), cache

        cold, cold_gets, _ = run()
        warm, warm_gets, cache = run()
    assert cold == warm and sorted(cold) == ALL_KEYS
    assert cold_gets >= Counter(f"{BUCKET}/cache/{name}" for name in [*ITEMS, *SHARDS])
    assert warm_gets == Counter()
    assert (cache.stats.hits, cache.stats.misses) == (len(ITEMS) + len(SHARDS), 0)
