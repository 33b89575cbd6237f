"""An S3 object rewritten between two ranged reads is refused, against SeaweedFS (the
other stores: tests/unit/sources/test_stream_changes.py)."""

import asyncio

import pytest

from asyncloader.sources._objectstore import StoreClient
from asyncloader.sources._retry import Permanent
from tests.servers import put_objects
from tests.unit.sources.test_stream_changes import store_stream, version


def test_an_s3_object_rewritten_between_blocks_is_refused(seaweed, monkeypatch):
    """s3://: every block is a GET with If-Match on the listed ETag."""
    import asyncloader.sources._objectstore as objectstore

    monkeypatch.setattr(objectstore, "_BLOCK", 4096)
    old, new = version(1), version(2)
    [url] = put_objects(seaweed, {"changes/s.tar": old})
    client = StoreClient("s3", seaweed.storage_options, max_connections=None, max_object_size=None)

    async def rewrite():
        await asyncio.to_thread(put_objects, seaweed, {"changes/s.tar": new})

    with pytest.raises(Permanent, match="changed while it was read"):
        store_stream(client, url, 0, {}, rewrite)
    put_objects(seaweed, {"changes/s.tar": old})
    pin = {}
    assert b"".join(store_stream(client, url, 0, pin)) == old
    put_objects(seaweed, {"changes/s.tar": new})
    with pytest.raises(Permanent, match="changed while it was read"):
        store_stream(client, url, 4096, pin)
