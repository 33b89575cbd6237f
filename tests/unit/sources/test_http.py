"""HTTPSource against a real aiohttp server: content, retries, faults, limits, secrets, loops."""

import asyncio
import logging
import pickle
import sys
from collections import Counter

import pytest
from torch.utils.data import DistributedSampler

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import HTTPSource, Retry, Skipped, drop_skipped
from tests.servers import Faults

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)


def objects(n, size=4096):
    """Bodies that differ per object and are checkable by content."""
    return {f"obj/{i:04d}": f"{i:04d}".encode() * (size // 4) for i in range(n)}


def bodies(loader):
    """The bodies delivered, in order (collate keeps them as a list of bytes)."""
    return [body for batch in loader for body in batch]


def test_item_is_the_body_of_its_url_with_sync_and_async_iteration(http_server):
    """Item i is the body of urls[i], in sampler order, through `for` and `async for`."""
    objs = objects(40)
    server = http_server(objs)
    source = HTTPSource([server.url(k) for k in objs])
    expected = list(objs.values())
    assert bodies(AsyncLoader(source, batch_size=8, collate_fn=list)) == expected

    async def run():
        return bodies([b async for b in AsyncLoader(source, batch_size=8, collate_fn=list)])

    assert asyncio.run(run()) == expected


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_exactly_once_under_injected_faults(http_server, world_size):
    """With 20% 503s plus resets and truncations, every sample arrives once, across all ranks."""
    objs = objects(60)
    rates = {"503": 0.2, "reset": 0.05, "truncate": 0.05}
    server = http_server(objs, Faults(rates=rates, seed=world_size))
    source = HTTPSource([server.url(k) for k in objs], retry=FAST)
    got, per_rank = [], []
    for rank in range(world_size):
        sampler = DistributedSampler(source, num_replicas=world_size, rank=rank, seed=7)
        loader = AsyncLoader(source, batch_size=4, sampler=sampler, collate_fn=list)
        delivered = bodies(loader)
        per_rank.append(len(delivered))
        got += delivered
    assert Counter(got) == Counter(objs.values())
    assert len(set(per_rank)) == 1
    faults = Counter(r.fault for r in server.requests)
    assert faults["503"] >= 5 and faults["reset"] + faults["truncate"] >= 2, faults


def test_retry_budget_spent_raises_fetch_error_naming_url_attempts_cause(http_server):
    """A URL that keeps failing raises FetchError after exactly `attempts` requests."""
    server = http_server(objects(2), Faults(script={"obj/0001": ["503"] * 10}))
    source = HTTPSource([server.url("obj/0000"), server.url("obj/0001")], retry=Retry(3, 0.001))
    with pytest.raises(FetchError) as info:
        bodies(AsyncLoader(source, batch_size=2, collate_fn=list))
    err = info.value
    assert err.target == server.url("obj/0001") and err.attempts == 3
    assert "HTTP 503" in err.cause and server.url("obj/0001") in str(err)
    assert sum(r.path == "obj/0001" for r in server.requests) == 3


@pytest.mark.parametrize("status", ["403", "404"])
def test_client_errors_other_than_429_are_not_retried(http_server, status):
    """A 403 or 404 fails at the first attempt."""
    server = http_server(objects(1), Faults(script={"obj/0000": [status] * 5}))
    source = HTTPSource([server.url("obj/0000")], retry=FAST)
    with pytest.raises(FetchError, match=f"after 1 attempt.*HTTP {status}"):
        bodies(AsyncLoader(source, collate_fn=list))
    assert len(server.requests) == 1


@pytest.mark.parametrize("fault", ["429", "503", "reset", "truncate"])
def test_transient_failures_are_retried_and_the_full_body_returned(http_server, fault):
    """429, 503, a reset mid-body and a body cut short are retried; the body is then whole."""
    objs = objects(1, size=256 * 1024)
    server = http_server(objs, Faults(script={"obj/0000": [fault, fault]}))
    source = HTTPSource([server.url("obj/0000")], retry=FAST)
    assert bodies(AsyncLoader(source, collate_fn=list)) == list(objs.values())
    assert [r.fault for r in server.requests] == [fault, fault, "ok"]


def test_a_stalled_request_times_out_and_is_retried(http_server):
    """A request that exceeds `timeout` is abandoned and retried."""
    objs = objects(1)
    server = http_server(objs, Faults(script={"obj/0000": ["stall"]}, stall=30))
    source = HTTPSource([server.url("obj/0000")], timeout=1.0, retry=FAST)
    assert bodies(AsyncLoader(source, collate_fn=list)) == list(objs.values())
    assert [r.fault for r in server.requests] == ["stall", "ok"]


def test_range_items_read_only_their_bytes(http_server):
    """(url, offset, length) items are Range reads returning exactly those bytes."""
    body = bytes(range(256)) * 4
    server = http_server({"blob": body})
    source = HTTPSource([(server.url("blob"), 10, 5), (server.url("blob"), 1000, 24)])
    assert bodies(AsyncLoader(source, batch_size=2, collate_fn=list)) == [body[10:15], body[1000:]]
    # The two reads are concurrent: the order they reach the server in is not fixed.
    assert sorted(r.range for r in server.requests) == ["bytes=10-14", "bytes=1000-1023"]


def test_max_object_size_refuses_large_bodies_without_retrying(http_server):
    """A body over max_object_size raises FetchError at the first attempt."""
    server = http_server(objects(1, size=8192))
    source = HTTPSource([server.url("obj/0000")], max_object_size=4096, retry=FAST)
    with pytest.raises(FetchError, match=r"after 1 attempt.*over max_object_size=4096"):
        bodies(AsyncLoader(source, collate_fn=list))


def test_skip_marks_counts_and_stops_at_max_skipped(http_server):
    """on_error='skip' returns Skipped markers, counts them, and raises past max_skipped."""
    objs = objects(10)
    script = {"obj/0003": ["404"], "obj/0007": ["404"]}
    server = http_server(objs, Faults(script=dict(script)))
    urls = [server.url(k) for k in objs]
    source = HTTPSource(urls, on_error="skip", max_skipped=2, retry=FAST)
    got = bodies(AsyncLoader(source, batch_size=5, collate_fn=drop_skipped(list)))
    expected = [b for k, b in objs.items() if k not in script]
    assert got == expected and source.skipped == 2
    assert len(source.skip_log) == 2 and "HTTP 404" in source.skip_log[0]

    markers = bodies(AsyncLoader(source, batch_size=5, collate_fn=list))
    assert not any(isinstance(m, Skipped) for m in markers), "nothing failed this time"
    server.set_faults(Faults(script={"obj/0001": ["404"]}))
    with pytest.raises(FetchError) as info:
        bodies(AsyncLoader(source, batch_size=5, collate_fn=list))
    assert any("max_skipped=2" in note for note in info.value.__notes__)


def test_skip_mode_needs_a_maximum():
    """on_error='skip' without max_skipped is refused with an exact message."""
    with pytest.raises(ValueError, match="on_error='skip' needs max_skipped=N"):
        HTTPSource(["http://127.0.0.1:1/x"], on_error="skip")
    with pytest.raises(ValueError, match="on_error='ignore' must be 'raise' or 'skip'"):
        HTTPSource(["http://127.0.0.1:1/x"], on_error="ignore")


def test_decode_hook_result_is_the_item(http_server):
    """decode(bytes) is what the loader receives."""
    objs = objects(4)
    server = http_server(objs)
    source = HTTPSource([server.url(k) for k in objs], decode=len)
    assert [int(x) for x in bodies(AsyncLoader(source, batch_size=4))] == [4096] * 4


def test_credentials_never_appear_in_repr_logs_or_errors(http_server, caplog):
    """Passwords, signed query values and auth headers are redacted everywhere."""
    server = http_server({}, Faults(script={"k": ["503"] * 3}))
    url = (
        server.url("k").replace("http://", "http://alice:hunter2pw@") + "?X-Amz-Signature=s3cr3tsig"
    )
    source = HTTPSource(
        [url], headers={"Authorization": "Bearer tok-abcdef"}, retry=Retry(3, 0.001)
    )
    caplog.set_level(logging.DEBUG, logger="asyncloader")
    with pytest.raises(FetchError) as info:
        bodies(AsyncLoader(source, collate_fn=list))
    shown = [repr(source), str(info.value), info.value.target, caplog.text]
    shown += info.value.__notes__
    for secret in ("hunter2pw", "s3cr3tsig", "tok-abcdef"):
        assert not any(secret in text for text in shown), secret
    assert "//***:***@" in info.value.target and "X-Amz-Signature=***" in info.value.target


def test_connection_pool_is_not_capped_by_aiohttp_default(http_server):
    """More than 100 requests are in flight with io_concurrency=150 (aiohttp's default cap)."""
    objs = objects(150, size=16)
    server = http_server(objs, Faults(latency=0.5))
    source = HTTPSource([server.url(k) for k in objs])
    loader = AsyncLoader(source, batch_size=150, io_concurrency=150, collate_fn=list)
    assert bodies(loader) == list(objs.values())
    assert 100 < server.max_active <= 150


def test_one_session_per_loop_closed_at_loop_shutdown(http_server):
    """Each epoch's loop gets its own session; none outlives its loop; pickling drops them."""
    objs = objects(6)
    server = http_server(objs)
    source = HTTPSource([server.url(k) for k in objs])
    sessions = source._client._sessions
    for _ in range(2):  # two `for` epochs: two loops in two threads
        assert bodies(AsyncLoader(source, batch_size=3, collate_fn=list)) == list(objs.values())
        assert len(sessions) == 0

    async def run():
        got = bodies([b async for b in AsyncLoader(source, batch_size=3, collate_fn=list)])
        assert len(sessions) == 1
        return got

    assert asyncio.run(run()) == list(objs.values())
    assert len(sessions) == 0
    clone = pickle.loads(pickle.dumps(source))
    assert bodies(AsyncLoader(clone, batch_size=3, collate_fn=list)) == list(objs.values())


def test_missing_aiohttp_is_a_clear_import_error(monkeypatch):
    """Without aiohttp, HTTPSource says which extra to install."""
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(ImportError, match=r"asyncloader\[remote\]"):
        HTTPSource(["http://127.0.0.1:1/x"])


def test_invalid_arguments_fail_in_the_constructor():
    """Bad URLs and options raise with exact messages."""
    with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
        HTTPSource(["ftp://example/x"])
    with pytest.raises(ValueError, match="timeout=0 must be > 0"):
        HTTPSource(["http://127.0.0.1:1/x"], timeout=0)
    with pytest.raises(ValueError, match="max_object_size=0 must be >= 1"):
        HTTPSource(["http://127.0.0.1:1/x"], max_object_size=0)
    with pytest.raises(TypeError, match="urls must be a sequence"):
        HTTPSource("http://127.0.0.1:1/x")


def test_for_epochs_of_one_loader_reuse_one_connection_pool(http_server, monkeypatch):
    """The `for` epochs of one loader run on its one loop thread, so the source opens one
    aiohttp session for all of them, closed when the loader closes."""
    import aiohttp

    opened = []
    original = aiohttp.ClientSession.__init__

    def counting(self, *args, **kwargs):
        opened.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", counting)
    server = http_server({f"o/{i}": bytes([i]) for i in range(8)})
    loader = AsyncLoader(HTTPSource([server.url(f"o/{i}") for i in range(8)]), batch_size=4)
    for _ in range(3):
        assert [list(b) for b in loader] == [
            [bytes([i]) for i in range(4)],
            [bytes([i]) for i in range(4, 8)],
        ]
    assert len(opened) == 1 and not opened[0].closed
    loader.close()
    assert opened[0].closed
