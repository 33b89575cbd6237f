"""A faulty HTTP server per test, for the source tests (SeaweedFS is in tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.servers import Faults, FaultyHTTPServer


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
