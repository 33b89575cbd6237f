"""A stream never splices two versions of an object: a resumed HTTP range
is checked against the first response's ETag (or Last-Modified) and size; an object store's
blocks against the ETag its first listing reported."""

import asyncio

import pytest

from asyncloader import FetchError
from asyncloader.sources import Retry, ShardedSource
from asyncloader.sources._objectstore import StoreClient
from asyncloader.sources._retry import Permanent
from tests.helpers import make_shard
from tests.servers import Faults

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)


def version(fill, n=6):
    """A shard whose samples hold ``fill``: versions of one size that differ in content."""
    return make_shard((f"k{i}", {"bin": bytes([fill]) * 1500}) for i in range(n))


def samples(source):
    async def run():
        async with asyncio.timeout(10):
            return [s async for s in source]

    return asyncio.run(run())


@pytest.mark.parametrize("validator", ["etag", "last-modified"])
@pytest.mark.parametrize("honours_if_match", [True, False])
def test_a_rewrite_between_a_reset_and_the_resumed_range_fails_permanently(
    http_server, validator, honours_if_match
):
    """The object is rewritten (same size) right after a reset; the resumed range is refused
    as a change of the object, whether or not the server honours If-Match."""
    old, new = version(1), version(2)
    assert len(old) == len(new)
    faults = Faults(
        script={"s.tar": ["truncate:5000"]},
        etag=validator == "etag",
        last_modified=validator == "last-modified",
        if_match=honours_if_match,
    )
    server = http_server({"s.tar": old}, faults)

    def rewrite(request):
        if request.fault.startswith("truncate"):
            server.objects["s.tar"] = new

    server.on_request = rewrite
    source = ShardedSource([server.url("s.tar")], samples_per_shard=[6], retry=FAST)
    with pytest.raises(FetchError, match=r"after 2 attempt.*changed while it was read") as info:
        samples(source)
    assert info.value.target == server.url("s.tar")
    assert server.requests[1].range is not None  # it was a resumed read


def test_a_resumed_range_of_another_size_is_refused_without_validators(http_server):
    """With neither ETag nor Last-Modified, the size is all there is to compare."""
    old, new = version(1), version(2, n=11)  # tar pads to 10 KiB records: 20 KiB, 30 KiB
    assert len(old) != len(new)
    faults = Faults(script={"s.tar": ["truncate:5000"]}, etag=False)
    server = http_server({"s.tar": old}, faults)
    server.on_request = lambda r: (
        r.fault.startswith("truncate") and server.objects.update({"s.tar": new})
    )
    source = ShardedSource([server.url("s.tar")], samples_per_shard=[6], retry=FAST)
    with pytest.raises(FetchError, match="changed while it was read"):
        samples(source)


def test_an_unchanged_object_resumes_after_resets(http_server):
    data = version(3)
    faults = Faults(script={"s.tar": ["reset:700", "reset:3000", "reset:100"]})
    server = http_server({"s.tar": data}, faults)
    source = ShardedSource([server.url("s.tar")], samples_per_shard=[6], retry=FAST)
    assert [s["bin"] for s in samples(source)] == [bytes([3]) * 1500] * 6
    # A resume at byte 0 (no whole member yet) is a fresh read; each other one is pinned.
    assert all((r.range is None) == ("If-Match" not in r.headers) for r in server.requests)
    assert sum(r.range is not None for r in server.requests) >= 2


def store_stream(client, url, start, pin, rewrite=None):
    """The chunks of ``client.stream``; ``rewrite()`` is awaited after the first."""

    async def run():
        out = []
        async for chunk in client.stream(url, start, pin):
            out.append(chunk)
            if rewrite is not None and len(out) == 1:
                await rewrite()
        return out

    return asyncio.run(run())


def test_a_store_object_rewritten_between_blocks_is_refused(http_server, monkeypatch):
    """Any fsspec store (here fsspec's HTTP filesystem): a block read after the object changed
    is refused, and so is a resume against a changed object."""
    import asyncloader.sources._objectstore as objectstore

    monkeypatch.setattr(objectstore, "_BLOCK", 4096)
    old, new = version(1), version(2)
    server = http_server({"s.tar": old})

    async def rewrite():
        server.objects["s.tar"] = new

    client = StoreClient("http", {}, max_connections=None, max_object_size=None)
    url = server.url("s.tar")
    with pytest.raises(Permanent, match="changed while it was read"):
        store_stream(client, url, 0, {}, rewrite)
    pin = {}
    server.objects["s.tar"] = old
    assert b"".join(store_stream(client, url, 0, pin)) == old
    server.objects["s.tar"] = new
    with pytest.raises(Permanent, match="changed while it was read"):
        store_stream(client, url, 4096, pin)
