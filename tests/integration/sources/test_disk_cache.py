"""DiskCache: sources read through a shared local cache.

The contract checkers run over cached sources cold, warm, partially warm, with a corrupted or
truncated entry, and with the server stopped; a writer SIGKILLed mid-write leaves nothing
that is served; concurrent readers (tasks here, ranks and workers under torchrun) download
each object once; a download reset part way resumes without a splice; eviction takes the
least recently used entries, the running epoch's last, those in use never.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import select
from collections import Counter
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from asyncloader import AsyncLoader
from asyncloader.errors import FetchError
from asyncloader.sources import DiskCache, HTTPSource, ObjectStoreSource, Retry, ShardedSource
from asyncloader.sources._cache.client import CachedClient
from asyncloader.sources._cache.layout import entry_key
from asyncloader.sources._redact import Redactor
from tests.helpers import shard_set
from tests.helpers.contracts import check_exactly_once, check_order, check_resume, epoch
from tests.helpers.paths import SYSTEM
from tests.helpers.waiting import WAIT_S
from tests.servers import Faults, FaultyHTTPServer

N, BATCH, SEED = 24, 4, 3
SHARD_SIZES = [5, 7, 4, 6, 2]
FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)
BIG = 1 << 30
CACHE_JOB = SYSTEM / "torchrun_scripts" / "cache_job.py"


def body(i: int) -> bytes:
    return f"{i:04d}".encode() * 64


def body_id(data: bytes) -> int:
    return int(data[:4])


ITEMS = {f"items/{i:04d}": body(i) for i in range(N)}
SHARDS = shard_set(len(SHARD_SIZES), SHARD_SIZES)
NAMES = list(SHARDS)
ALL_KEYS = sorted(f"s{s:03d}-{i:04d}" for s, n in enumerate(SHARD_SIZES) for i in range(n))


def gets(server: FaultyHTTPServer) -> Counter:
    """GET requests per path so far."""
    return Counter(r.path for r in server.requests if r.method == "GET")


def entry_file(cache_dir: Path, url: str) -> Path:
    """Where the cache keeps the whole object at ``url``."""
    key = entry_key("", url, None, None)
    return cache_dir / "data" / key[:2] / key


def cache_of(source: Any) -> DiskCache:
    return source._client.cache


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def map_order() -> list[int]:
    """DataLoader's order for the map-style loaders' shuffle."""
    shuffled = DataLoader(range(N), batch_size=BATCH, shuffle=True, generator=generator())
    return [int(i) for batch in shuffled for i in batch]


def http_loader(urls: list[str], cache_dir: Path, **kw: Any) -> AsyncLoader:
    source = HTTPSource(urls, retry=FAST, cache=DiskCache(cache_dir, max_bytes=BIG))
    return AsyncLoader(
        source, batch_size=BATCH, shuffle=True, generator=generator(), collate_fn=list, **kw
    )


def ids(batch: list[bytes]) -> list[int]:
    return [body_id(b) for b in batch]


def sharded(urls: list[str], cache_dir: Path | None, **kw: Any) -> ShardedSource:
    cache = None if cache_dir is None else DiskCache(cache_dir, max_bytes=BIG)
    opts = dict(samples_per_shard=SHARD_SIZES, shuffle_buffer=6, seed=SEED, retry=FAST)
    return ShardedSource(urls, **opts | {"cache": cache} | kw)


def sharded_loader(source: ShardedSource, **kw: Any) -> AsyncLoader:
    return AsyncLoader(source, batch_size=BATCH, collate_fn=list, **kw)


def keys(batch: list[dict]) -> list[str]:
    return [sample["__key__"] for sample in batch]


def flat_keys(batches: list[list[str]]) -> list[str]:
    return [k for batch in batches for k in batch]


async def drain(source: Any) -> list[str]:
    return [sample["__key__"] async for sample in source]


def test_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="path"):
        DiskCache(3, max_bytes=1)  # type: ignore[arg-type]
    for bad in ("1", True, 1.0):
        with pytest.raises(TypeError, match="max_bytes"):
            DiskCache(tmp_path, max_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        DiskCache(tmp_path, max_bytes=0)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match="path"):
        DiskCache(tmp_path / "file", max_bytes=1)
    for make in (
        lambda: HTTPSource(["http://127.0.0.1:9/x"], cache="dir"),
        lambda: ShardedSource(["http://127.0.0.1:9/x.tar"], cache=tmp_path),
        lambda: ObjectStoreSource(["s3://bucket/key"], cache=1),
    ):
        with pytest.raises(TypeError, match="cache must be a DiskCache"):
            make()


def test_http_source_cold_warm_in_workers_then_offline(tmp_path):
    """Cold: each item fetched once, in DataLoader's order. Warm (a new source and cache
    object, fetched in worker processes): no request, the workers' hits counted here. The
    server stopped: the epoch still runs."""
    with FaultyHTTPServer(ITEMS, Faults(jitter=0.002, seed=SEED)) as server:
        urls = [server.url(name) for name in ITEMS]
        cold = http_loader(urls, tmp_path)
        check_order(epoch(cold, ids), map_order())
        assert gets(server) == Counter(list(ITEMS))
        stats = cache_of(cold.dataset).stats
        assert (stats.misses, stats.hits) == (N, 0), stats
        assert stats.bytes_fetched == sum(map(len, ITEMS.values()))
        warm = http_loader(urls, tmp_path, num_workers=2, fetch_in_workers=True)
        check_order(epoch(warm, ids), map_order())
        assert gets(server) == Counter(list(ITEMS))
        stats = cache_of(warm.dataset).stats
        assert (stats.hits, stats.misses) == (N, 0), stats
        assert stats.bytes_hit == sum(map(len, ITEMS.values()))
    offline = http_loader(urls, tmp_path)
    check_order(epoch(offline, ids), map_order())
    report = cache_of(offline.dataset).report()
    assert f"hits {N} " in report and "misses 0 " in report, report


def test_sharded_source_partially_warm_corrupted_truncated_and_offline(tmp_path):
    """The stream's order is the uncached one whatever the cache holds; only what is missing
    or invalid is requested, once; an invalid entry is dropped and fetched again."""
    cache_dir = tmp_path / "cache"
    with FaultyHTTPServer(SHARDS, Faults(jitter=0.002, seed=SEED)) as server:
        urls = [server.url(name) for name in SHARDS]
        reference = flat_keys(epoch(sharded_loader(sharded(urls, None)), keys))
        server.requests.clear()
        warmed = [1, 3]  # by another source, reading two of the shards
        asyncio.run(drain(ShardedSource([urls[s] for s in warmed], cache=DiskCache(
            cache_dir, max_bytes=BIG))))  # fmt: skip
        assert gets(server) == Counter(NAMES[s] for s in warmed)
        check_order(epoch(sharded_loader(sharded(urls, cache_dir)), keys), reference)
        assert gets(server) == Counter(NAMES)  # the three others, once
        corrupt(entry_file(cache_dir, urls[0]))
        truncate(entry_file(cache_dir, urls[2]))
        in_workers = sharded_loader(sharded(urls, cache_dir), num_workers=2, fetch_in_workers=True)
        check_exactly_once(epoch(in_workers, keys), reference)
        assert gets(server) == Counter(NAMES) + Counter([NAMES[0], NAMES[2]])
        assert cache_of(in_workers.dataset).stats.dropped == 2
    check_order(epoch(sharded_loader(sharded(urls, cache_dir)), keys), reference)


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(data)


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 10)


def test_a_cached_sharded_source_resumes_at_any_point(tmp_path):
    """check_resume over cached shard streams: the loaders take turns on two directories,
    so the first ones start cold, the later ones warm."""
    with FaultyHTTPServer(SHARDS) as server:
        urls = [server.url(name) for name in SHARDS]
        dirs = itertools.cycle([tmp_path / "a", tmp_path / "b"])
        check_resume(lambda: sharded_loader(sharded(urls, next(dirs))), (0, 3, 6), key=keys)


def test_concurrent_readers_download_each_object_once(tmp_path):
    """Two sources with their own cache objects on one directory read the same items at
    once: every item is requested once; the second reader of each waited for it."""
    with FaultyHTTPServer(ITEMS, Faults(latency=0.05)) as server:
        urls = [server.url(name) for name in ITEMS]
        a, b = (HTTPSource(urls, cache=DiskCache(tmp_path, max_bytes=BIG)) for _ in "ab")

        async def both() -> list:
            return await asyncio.gather(*(s[i] for i in range(N) for s in (a, b)))

        got = asyncio.run(both())
    assert [body_id(x) for x in got] == [i for i in range(N) for _ in "ab"]
    assert gets(server) == Counter(list(ITEMS))
    stats = cache_of(a).stats
    assert (stats.misses, stats.hits, stats.waits) == (N, N, N), stats


def test_a_download_reset_part_way_resumes_and_a_changed_object_is_never_spliced(tmp_path):
    """A reset after some bytes: the download resumes from there (a Range request) and the
    entry is the whole object. The object replaced between the reset and the resumption:
    a permanent FetchError, and no entry is written."""
    name, first, changed = NAMES[1], tmp_path / "first", tmp_path / "changed"
    with FaultyHTTPServer(SHARDS, Faults(script={name: ["reset:3000"]})) as server:
        url = server.url(name)
        one = dict(samples_per_shard=[SHARD_SIZES[1]], shuffle=False, retry=FAST)
        source = ShardedSource([url], cache=DiskCache(first, max_bytes=BIG), **one)
        assert asyncio.run(drain(source)) == [f"s001-{i:04d}" for i in range(SHARD_SIZES[1])]
        assert [r.range for r in server.requests] == [None, "bytes=3000-"]
        assert entry_file(first, url).read_bytes().startswith(SHARDS[name])

        server.set_faults(Faults(script={name: ["reset:3000"]}))
        server.on_request = lambda request: server.objects.update({name: SHARDS[NAMES[2]]})
        source = ShardedSource([url], cache=DiskCache(changed, max_bytes=BIG), **one)
        with pytest.raises(FetchError, match="changed"):
            asyncio.run(drain(source))
    assert not entry_file(changed, url).exists()


class MemoryClient:
    """An in-memory client (``targets`` -> bytes) that counts its requests."""

    redact = Redactor()

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.requests: Counter = Counter()

    def shown(self, target: str) -> str:
        return target

    async def read(self, target: str, start: int | None, length: int | None) -> bytes:
        self.requests[target] += 1
        return self.objects[target]

    async def stream(self, target: str, start: int, pin: dict) -> AsyncGenerator[bytes, None]:
        self.requests[target] += 1
        data = self.objects[target]
        for at in range(start, len(data), 1000):
            yield data[at : at + 1000]

    async def aclose(self) -> None:
        pass


class HangsAfterFirstChunk(MemoryClient):
    """Streams one chunk, then (once the cache has written it) says so on ``ready`` and
    hangs: the moment its process is killed."""

    def __init__(self, objects: dict[str, bytes], ready: int) -> None:
        super().__init__(objects)
        self.ready = ready

    async def stream(self, target: str, start: int, pin: dict) -> AsyncGenerator[bytes, None]:
        yield self.objects[target][:1000]
        os.write(self.ready, b"1")
        await asyncio.Event().wait()


def _write_and_hang(cache_dir: Path, objects: dict[str, bytes], ready: int) -> None:
    client = CachedClient(HangsAfterFirstChunk(objects, ready), DiskCache(cache_dir, max_bytes=BIG))

    async def read() -> None:
        async for _ in client.stream("big", 0, {}):
            pass

    asyncio.run(read())


def test_a_writer_killed_mid_write_leaves_nothing_served(tmp_path):
    """SIGKILLed after writing part of an object: no entry, only its temporary file; the next
    reader is not held by the dead writer's lock, fetches the object whole and removes the
    dead writer's file."""
    objects = {"big": os.urandom(10_000)}
    read_end, write_end = os.pipe()
    child = multiprocessing.get_context("fork").Process(
        target=_write_and_hang, args=(tmp_path, objects, write_end)
    )
    child.start()
    try:  # the pipe, or the child's exit (a failure before it wrote)
        select.select([read_end, child.sentinel], [], [], WAIT_S)
        assert select.select([read_end], [], [], 0)[0], "the writer never wrote its first chunk"
    finally:
        child.kill()
        child.join()
        os.close(read_end)
        os.close(write_end)
    assert len(list((tmp_path / "tmp").iterdir())) == 1
    assert not entry_file(tmp_path, "big").exists()
    client = MemoryClient(objects)
    cached = CachedClient(client, DiskCache(tmp_path, max_bytes=BIG))

    async def read() -> bytes:
        return b"".join([chunk async for chunk in cached.stream("big", 0, {})])

    assert asyncio.run(read()) == objects["big"]
    assert client.requests["big"] == 1
    assert list((tmp_path / "tmp").iterdir()) == []
    assert cached.cache.stats.waits == 0


def test_eviction_takes_the_least_recently_used_but_not_in_use_nor_still_needed(tmp_path):
    objects = {f"o{i}": bytes([i]) * 10_000 for i in range(8)}
    client = MemoryClient(objects)
    probe = DiskCache(tmp_path / "probe", max_bytes=BIG)
    asyncio.run(CachedClient(MemoryClient(objects), probe).read("o0", None, None))
    entry = probe.stats.stored_bytes  # one entry's size on disk
    cache = DiskCache(tmp_path / "cache", max_bytes=entry * 7 // 2)  # room for 3.5
    cached = CachedClient(client, cache)

    def held() -> set[str]:
        return {t for t in objects if entry_file(tmp_path / "cache", t).exists()}

    async def run() -> None:
        for t in ("o0", "o1", "o2", "o0", "o3"):  # o0 used again: o1 is the oldest now
            await cached.read(t, None, None)
        assert held() == {"o0", "o2", "o3"}
        stream = cached.stream("o2", 0, {})
        await anext(stream)  # o2 in use from now on
        for t in ("o3", "o0"):  # o2 the least recently used, then o3
            await cached.read(t, None, None)
        cached.plan(["o3"])  # o3 still needed by the running epoch
        await cached.read("o4", None, None)
        assert held() == {"o2", "o3", "o4"}
        await stream.aclose()
        await cached.read("o5", None, None)
        assert held() == {"o3", "o4", "o5"}

    asyncio.run(run())
    stats = cache.stats
    assert (stats.evictions, stats.misses, stats.hits) == (3, 6, 4), cache.report()
    assert stats.stored_bytes == sum(entry_file(tmp_path / "cache", t).stat().st_size
                                     for t in held())  # fmt: skip


def test_an_object_larger_than_the_cache_is_served_but_not_kept(tmp_path):
    objects = {"huge": os.urandom(50_000), "small": b"x"}
    cached = CachedClient(MemoryClient(objects), DiskCache(tmp_path, max_bytes=20_000))

    async def run() -> tuple[bytes, bytes]:
        whole = await cached.read("huge", None, None)
        streamed = b"".join([c async for c in cached.stream("huge", 0, {})])
        return whole, streamed

    assert asyncio.run(run()) == (objects["huge"], objects["huge"])
    assert not entry_file(tmp_path, "huge").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sources_report_their_cache(tmp_path):
    cache = DiskCache(tmp_path, max_bytes=BIG)
    source = HTTPSource(["http://127.0.0.1:9/x"], cache=cache)
    assert repr(cache) in repr(source)
    assert str(tmp_path) in cache.report() and "hits 0 " in cache.report()
