"""The integration tier: tests whose worker processes are forked from this one (local servers
run as threads here). A test here that starts a fresh interpreter (a script, a job, a spawned
or fork-server worker) or an external server fails, naming what it started: it belongs in
tests/system."""

import pytest

from tests.helpers.tiers import counting_starts


@pytest.fixture(autouse=True)
def _starts_only_forked_workers():
    with counting_starts() as started:
        yield
    fresh = {kind: n for kind, n in started.items() if kind not in ("fork", "process (fork)")}
    if fresh:
        pytest.fail(
            f"an integration test started {fresh}: fresh interpreters and external servers "
            "belong in tests/system"
        )
