"""The default, deadline-based retry policy against a real faulty HTTP server.

The policy's own timing is tested with a fake clock in test_retry.py; here the waits are real
but short: ``QUICK`` keeps the default deadline and attempt bound with millisecond backoff.
"""

import time
from collections import Counter

import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import HTTPSource, Retry
from tests.servers import Faults

QUICK = Retry(backoff=0.001, max_backoff=0.01)  # the default deadline=60.0 and attempts=50


def objects(n, size=256):
    """Bodies that differ per object and are checkable by content."""
    return {f"obj/{i:04d}": f"{i:04d}".encode() * (size // 4) for i in range(n)}


def deliver(urls, retry, batch_size=10):
    """The bodies an AsyncLoader over HTTPSource(urls) delivers, in order."""
    loader = AsyncLoader(
        HTTPSource(urls, retry=retry), batch_size=batch_size, io_concurrency=64, collate_fn=list
    )
    return [body for batch in loader for body in batch]


def test_default_policy_delivers_every_sample_under_20_percent_503s(http_server):
    """300 URLs with 20% of requests answered 503: every sample arrives exactly once, in order
    (Retry(attempts=5), the former default, loses one about one run in eleven)."""
    objs = objects(300)
    server = http_server(objs, Faults(rates={"503": 0.2}, seed=14))
    assert deliver([server.url(k) for k in objs], QUICK) == list(objs.values())
    faults = Counter(r.fault for r in server.requests)
    assert faults["503"] >= 30 and faults["ok"] == 300, faults


def test_a_run_of_failures_longer_than_the_former_budget_is_survived(http_server):
    """Twelve 503s in a row for one URL: the default policy retries through them, where
    Retry(attempts=5) gives up after five requests."""
    objs = objects(20)
    script = {"obj/0007": ["503"] * 12}
    server = http_server(objs, Faults(script={k: list(v) for k, v in script.items()}))
    urls = [server.url(k) for k in objs]
    assert deliver(urls, QUICK, batch_size=4) == list(objs.values())
    assert sum(r.path == "obj/0007" for r in server.requests) == 13

    server.set_faults(Faults(script={k: list(v) for k, v in script.items()}))
    with pytest.raises(FetchError, match="obj/0007: gave up after 5 attempt") as info:
        deliver(urls, Retry(attempts=5, backoff=0.001, max_backoff=0.01), batch_size=4)
    assert info.value.reason == "retry gave up: attempts=5 requests in a row failed"


def test_deadline_ends_retrying_of_a_url_that_never_recovers(http_server):
    """A URL that always answers 503 fails after about `deadline` seconds, saying so."""
    server = http_server(objects(1), Faults(rates={"503": 1.0}))
    retry = Retry(attempts=None, backoff=0.01, max_backoff=0.05, deadline=0.3)
    start = time.monotonic()
    with pytest.raises(FetchError, match="gave up after") as info:
        deliver([server.url("obj/0000")], retry)
    assert 0.25 <= time.monotonic() - start < 3
    assert info.value.attempts == len(server.requests) >= 5
    assert "would pass deadline=0.3s" in info.value.reason
