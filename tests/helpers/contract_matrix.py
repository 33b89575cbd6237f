"""The loader's contracts over every kind of source and placement: order, exactly-once,
bounded window, clean shutdown, resume, random draws in the workers repeating with the same
seed. Each is checked by one checker of tests/helpers/contracts.py.

KINDS is the table of sources; each kind names in ``cannot`` what it cannot do and why, and
the tests check what it does instead (a stream without state_dict() keeps the resume contract
by being replayed, and must say so).

The tests here are collected by one module per tier, which picks its kinds and placements
with :func:`parametrize_matrix`: tests/unit/test_contracts.py runs them in this process,
tests/integration/test_contracts.py in workers, tests/system/test_contracts.py against the
external object store; tests/unit/test_contract_checkers.py shows that each checker can fail.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc
import pytest
import torch
from torch.utils.data import DataLoader

from asyncloader import AsyncLoader
from asyncloader.sources import (
    FileSource,
    HTTPSource,
    JsonlSource,
    ObjectStoreSource,
    ParquetSource,
    Retry,
    ShardedSource,
)
from tests.helpers import (
    AsyncIterSource,
    AsyncSource,
    Draws,
    GetitemsSource,
    IterSource,
    SyncSource,
    as_worker,
    jitter,
    shard_set,
)
from tests.helpers.columnar import jsonl_bytes, parquet_set, rows
from tests.helpers.contracts import (
    STOPS,
    check_bounded_window,
    check_clean_shutdown,
    check_exactly_once,
    check_order,
    check_repeatable,
    check_resume,
    epoch,
    round_robin,
)
from tests.servers import BUCKET, Faults, FaultyHTTPServer, put_objects

N, BATCH, SEED = 42, 4, 3  # 10 batches and a short one
SHARD_SIZES = [7, 12, 5, 9, 9]  # N samples in uneven shards
JITTER_S = 0.004  # random latency per request, as the in-memory sources have per sample
FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)


def body(i: int) -> bytes:
    """The bytes of remote or file item ``i``: its index, readable back by ``body_id``."""
    return f"{i:04d}".encode() * 64


def body_id(data: bytes) -> int:
    return int(data[:4])


ITEMS = {f"contracts/{i:04d}": body(i) for i in range(N)}
SHARDS = {f"contracts/{name}": data for name, data in shard_set(5, SHARD_SIZES).items()}
# N rows in three files of uneven row groups (row groups of 4: 5 + 4 + 2 of them).
PARQUET = {f"contracts/{name}": data for name, data in parquet_set([17, 16, 9], 4).items()}
# N lines in three zstd-compressed JSON Lines files.
JSONL = {
    f"contracts/lines-{k}.jsonl.zst": jsonl_bytes(rows(first, n), "zst")
    for k, (first, n) in enumerate([(0, 20), (20, 9), (29, 13)])
}


# The servers' threads live as long as their fixtures: module-scoped, not session-scoped, so
# that later modules start in a process without other threads (workers are forked then).


@pytest.fixture(scope="module")
def contract_http():
    """ITEMS and SHARDS served on 127.0.0.1, each response after a random latency."""
    objects = ITEMS | SHARDS | PARQUET | JSONL
    with FaultyHTTPServer(objects, Faults(jitter=JITTER_S, seed=SEED)) as server:
        yield server


@pytest.fixture(scope="module")
def contract_s3(seaweed):
    """storage_options for ITEMS in SeaweedFS, through a proxy adding a random latency."""
    put_objects(seaweed, ITEMS)
    with FaultyHTTPServer({}, Faults(jitter=JITTER_S, seed=SEED), seaweed.endpoint) as proxy:
        endpoint = {"endpoint_url": proxy.url("")[:-1]}
        options = seaweed.storage_options
        yield options | {"client_kwargs": options["client_kwargs"] | endpoint}


@pytest.fixture(scope="module")
def contract_files(tmp_path_factory):
    """ITEMS as local files; their paths."""
    folder = tmp_path_factory.mktemp("contracts")
    paths = []
    for name, data in ITEMS.items():
        paths.append(folder / name.split("/")[1])
        paths[-1].write_bytes(data)
    return paths


# Factories of fresh sources, one per kind; ``request`` starts the servers a kind needs.


def files(request) -> Callable[[], FileSource]:
    paths = request.getfixturevalue("contract_files")
    return lambda: FileSource(paths)


def http(request) -> Callable[[], HTTPSource]:
    server = request.getfixturevalue("contract_http")
    urls = [server.url(name) for name in ITEMS]
    return lambda: HTTPSource(urls, retry=FAST)


def object_store(request) -> Callable[[], ObjectStoreSource]:
    options = request.getfixturevalue("contract_s3")
    keys = [f"s3://{BUCKET}/{name}" for name in ITEMS]
    return lambda: ObjectStoreSource(keys, storage_options=options, retry=FAST)


def sharded_tar(request) -> Callable[[], ShardedSource]:
    server = request.getfixturevalue("contract_http")
    urls = [server.url(name) for name in SHARDS]
    opts = dict(samples_per_shard=SHARD_SIZES, shuffle_buffer=6, retry=FAST, seed=SEED)
    return lambda: ShardedSource(urls, **opts)


def parquet(request, **kwargs: Any) -> Callable[[], ParquetSource]:
    server = request.getfixturevalue("contract_http")
    urls = [server.url(name) for name in PARQUET]
    opts = dict(shuffle=True, shuffle_buffer=6, row_group_concurrency=3, retry=FAST, seed=SEED)
    return lambda: ParquetSource(urls, **opts, **kwargs)


#: Keeps the 21 even rows of the 42: every row group holds some, none is ruled out whole.
KEPT_ROWS = pc.field("flag")


def jsonl(request, parse: str = "json") -> Callable[[], JsonlSource]:
    server = request.getfixturevalue("contract_http")
    urls = [server.url(name) for name in JSONL]
    opts = dict(shuffle=True, shuffle_buffer=6, lines_per_file=[20, 9, 13], retry=FAST, seed=SEED)
    return lambda: JsonlSource(urls, parse=parse, **opts)


def row_id(row: Any) -> int:
    return int(row[0])


def key_id(sample: dict) -> str:
    return sample["__key__"]


@dataclass(frozen=True)
class Kind:
    """A kind of source and how the contract tests use it.

    Attributes:
        name: The kind, as tests name it.
        sources: ``sources(request)`` is a factory of fresh sources (its servers started).
        sample_id: Reads a delivered sample's id (its index, or its key).
        map_style: Shuffled by the loader's sampler (else a stream, in its own order).
        loader_kw: The loader's arguments it needs (collate, a jittered transform).
        cannot: What it cannot do, and why; the tests check what it does instead.
        resume_points: Batches to stop after; None: after every one.
    """

    name: str
    sources: Callable[[pytest.FixtureRequest], Callable[[], Any]]
    sample_id: Callable[[Any], Any]
    map_style: bool
    loader_kw: dict = field(default_factory=dict)
    cannot: dict[str, str] = field(default_factory=dict)
    resume_points: tuple[int, ...] | None = None


REPLAYED = "restart at its position"
STATELESS = {REPLAYED: "no state_dict(): resume replays it, dropping the batches delivered"}
BYTES = {"collate_fn": list}
STREAM = {"transform": jitter}  # batches finish out of order in the executor
KINDS = [
    Kind("sync-map", lambda r: lambda: SyncSource(N), row_id, True),
    Kind("getitems-map", lambda r: lambda: GetitemsSource(N), row_id, True),  # a call per batch
    Kind("async-map", lambda r: lambda: AsyncSource(N), row_id, True),
    Kind("sync-iterable", lambda r: lambda: IterSource(N), row_id, False, STREAM, STATELESS),
    Kind("async-iterable", lambda r: lambda: AsyncIterSource(N), row_id, False, STREAM, STATELESS),
    Kind("files", files, body_id, True, BYTES),
    Kind("http", http, body_id, True, BYTES),
    # Each loader makes its own S3 client (~0.4 s): five stops, not twelve.
    Kind("object-store", object_store, body_id, True, BYTES, resume_points=(0, 1, 6, 10, 11)),
    Kind("sharded-tar", sharded_tar, key_id, False, BYTES | STREAM),
    Kind("parquet", parquet, lambda row: row["id"], False, BYTES | STREAM),
    Kind(
        "parquet-filter",
        lambda r: parquet(r, filter=KEPT_ROWS),
        lambda row: row["id"],
        False,
        BYTES | STREAM,
    ),
    Kind("jsonl", jsonl, lambda row: row["id"], False, BYTES | STREAM),
    Kind("jsonl-arrow", lambda r: jsonl(r, "arrow"), lambda row: row["id"], False, BYTES | STREAM),
]
# Where the work runs: this process's loop and threads; 2 workers transforming (and calling
# a sync __getitem__); 2 workers fetching too, each on its own loop and iterating its own copy
# of an iterable source (its part of it: the sources here shard by get_worker_info()).
IN_WORKERS = {"num_workers": 2, "fetch_in_workers": True}
WITH_WORKERS = [
    pytest.param({"num_workers": 2}, id="workers=2"),
    pytest.param(IN_WORKERS, id="fetch-in-workers"),
]
#: Tests of what workers do: their placements are only those with workers.
WORKERS_ONLY = frozenset({"test_resume_with_workers", "test_draws_in_workers_repeat"})
IN_PROCESS = pytest.param({}, id="workers=0")
PLACEMENTS = [IN_PROCESS, *WITH_WORKERS]
WORKER_RESUME_POINTS = (6,)  # with workers, one stop mid-epoch: each loader starts a pool


def parametrize_matrix(metafunc: pytest.Metafunc, kinds: list[Kind], placements: list) -> None:
    """``pytest_generate_tests`` of a tier's contract module: its tests run over ``kinds``
    and, those that take a ``placement``, over ``placements``."""
    if "kind" in metafunc.fixturenames:
        metafunc.parametrize("kind", kinds, ids=[k.name for k in kinds])
    if "placement" in metafunc.fixturenames:
        if metafunc.function.__name__ in WORKERS_ONLY:
            placements = [p for p in placements if p.values[0].get("num_workers")]
        metafunc.parametrize("placement", placements)


def streams_in_workers(kind, placement) -> bool:
    """Each worker iterates its own part of the source (batches taken round robin)."""
    return not kind.map_style and placement.get("fetch_in_workers", False)


@pytest.fixture
def sources(request, kind):
    """A factory of fresh sources of ``kind``, its servers started."""
    return kind.sources(request)


def loader(kind, sources, **kw) -> AsyncLoader:
    """A loader over a fresh source; map-style sources are shuffled from SEED."""
    opts = dict(batch_size=BATCH, **kind.loader_kw)
    if kind.map_style:
        opts |= dict(shuffle=True, generator=generator())
    return AsyncLoader(sources(), **opts | kw)


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def key_of(kind):
    return lambda batch: [kind.sample_id(s) for s in batch]


def expected(kind, sources, placement=None) -> list:
    """The order the samples must come in: DataLoader's with the same shuffle (map-style), the
    stream's own, or with each worker iterating its own part, those parts round robin."""
    if kind.map_style:
        shuffled = DataLoader(range(N), batch_size=BATCH, shuffle=True, generator=generator())
        return [int(i) for batch in shuffled for i in batch]
    if placement is not None and streams_in_workers(kind, placement):
        n = placement["num_workers"]
        parts = []
        for w in range(n):
            with as_worker(w, n):
                parts.append(stream_of(kind, sources()))
        return round_robin(parts, BATCH)
    return stream_of(kind, sources())


def stream_of(kind, source) -> list:
    """The ids of what ``source`` yields, iterated here."""
    if hasattr(source, "__aiter__"):

        async def stream():
            return [kind.sample_id(s) async for s in source]

        return asyncio.run(stream())
    return [kind.sample_id(s) for s in source]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_order(kind, sources, placement, mode):
    """in_order=True: samples come in sampler (or stream) order though they finish out of
    order; a source each worker iterates comes round robin over the workers' parts."""
    batches = epoch(loader(kind, sources, **placement), key_of(kind), mode=mode)
    check_order(batches, expected(kind, sources, placement))


def test_exactly_once(kind, sources, placement):
    """in_order=False: every sample of the epoch is delivered exactly once."""
    made = loader(kind, sources, **placement, in_order=False)
    check_exactly_once(epoch(made, key_of(kind)), expected(kind, sources))


def test_bounded_window(kind, sources, placement):
    """A slow consumer: batches ahead stay within stats.window, fetches within io_concurrency."""
    made = loader(kind, sources, **placement, io_concurrency=8, prefetch=2)
    epoch(made, key_of(kind), slow=True)
    check_bounded_window(made.stats)


@pytest.mark.parametrize("stop", STOPS)
def test_clean_shutdown(kind, sources, placement, stop):
    """Stopped after one batch, the epoch leaves no thread and no worker process behind."""
    check_clean_shutdown(loader(kind, sources, **placement), stop)


def resume(kind, sources, points, **kw) -> None:
    """check_resume over ``kind``; a stateless stream must warn that it is replayed (in this
    process: workers iterating their own copies replay theirs without a warning)."""

    def make(**opts) -> AsyncLoader:
        return loader(kind, sources, **opts | kw)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_resume(make, points, key=key_of(kind), in_order=kw.get("in_order", True))
    replayed = any("pulling and dropping" in str(w.message) for w in caught)
    warns = REPLAYED in kind.cannot and not kw.get("fetch_in_workers")
    assert replayed == warns, [str(w.message) for w in caught]


def test_resume_at_every_position(kind, sources):
    """Stopped after any k batches and resumed in a new loader: the same batches follow."""
    resume(kind, sources, kind.resume_points)


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "unordered"])
def test_resume_with_workers(kind, sources, placement, in_order):
    """With 2 workers, mid-epoch: the same batches follow, or (unordered) the missing ones."""
    resume(kind, sources, WORKER_RESUME_POINTS, **placement, in_order=in_order)


def test_draws_in_workers_repeat(kind, sources, placement):
    """A transform drawing from the global RNGs in the workers: the same draws for the same
    generator seed, run after run and for 1 or 2 workers. A source each worker iterates is
    seeded per worker, as under DataLoader: its draws repeat for the same worker count."""

    def make(num_workers: int, seed: int) -> AsyncLoader:
        transform = Draws(kind.loader_kw.get("transform"))
        opts = placement | dict(transform=transform, collate_fn=list, num_workers=num_workers)
        return loader(kind, sources, **opts, generator=torch.Generator().manual_seed(seed))

    counts = (2, 2) if streams_in_workers(kind, placement) else (2, 2, 1)
    check_repeatable(make, lambda batch: [(kind.sample_id(s), d) for s, d in batch], counts)
