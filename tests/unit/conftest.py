"""The unit tier: tests that start no process (threads and servers on 127.0.0.1 in this process
are fine). A test here that starts one fails, naming what it started and where it belongs."""

import pytest

from tests.helpers.tiers import counting_starts


@pytest.fixture(autouse=True)
def _starts_no_process():
    with counting_starts() as started:
        yield
    if started:
        pytest.fail(
            f"a unit test started {dict(started)}: a test with worker processes belongs in "
            "tests/integration, one with scripts or servers of their own in tests/system"
        )
