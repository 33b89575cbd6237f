"""HTTP replies that lie or stall: compressed sizes, redirects carrying secrets, trickles,
Retry-After forms, bodies whose end cannot be verified."""

import asyncio
import email.utils
import time

import pytest

from asyncloader import FetchError
from asyncloader.sources import HTTPSource, Retry, ShardedSource, _http
from asyncloader.sources._retry import Permanent
from tests.helpers import shard_set
from tests.servers import Faults

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)
SECRETS = {
    "Authorization": "Bearer tok-abcdef",
    "X-Api-Key": "key-123456",
    "X-Amz-Security-Token": "sts-zzzzzz",
    "Cookie": "session=c00k1e",
    "X-Upstream": "http://127.0.0.1:1/x?sig=upstream-sig",  # a URL carrying a credential
}


def read(source, index=0):
    """``await source[index]`` on a loop of its own (its session closed with the loop)."""

    async def run():
        return await source[index]

    return asyncio.run(run())


def stream(source, limit=10.0):
    """The sample keys of one pass over a ShardedSource, bounded by ``limit`` seconds."""

    async def run():
        async with asyncio.timeout(limit):
            return [s["__key__"] async for s in source]

    return asyncio.run(run())


# Item 2: max_object_size holds for the decoded body.


def test_a_compressed_body_is_held_to_max_object_size_once_decoded(http_server):
    """A 32 MiB body gzipped to ~32 KiB under max_object_size=1 MiB fails permanently."""
    server = http_server({"bomb": bytes(32 << 20)}, Faults(script={"bomb": ["gzip"]}))
    source = HTTPSource([server.url("bomb")], max_object_size=1 << 20, retry=FAST)
    with pytest.raises(FetchError, match=r"after 1 attempt.*over max_object_size=1048576"):
        read(source)
    assert len(server._gzipped[bytes(32 << 20)]) < 1 << 20  # the declared size was under it


def test_a_compressed_body_under_the_limit_is_delivered_decoded(http_server):
    body = b"0123456789abcdef" * 4096
    server = http_server({"text": body}, Faults(script={"text": ["gzip"]}))
    assert read(HTTPSource([server.url("text")], max_object_size=len(body))) == body


# Item 3: secret headers stay with their origin.


def test_secret_headers_do_not_follow_a_redirect_to_another_origin(http_server):
    """Every header HTTPSource treats as secret is dropped when a redirect leaves the origin
    (another port); the others still go."""
    other = http_server({"obj": b"there"})
    server = http_server({}, Faults(script={"start": [f"redirect:{other.url('obj')}"]}))
    source = HTTPSource([server.url("start")], headers={**SECRETS, "X-Trace": "plain"})
    assert read(source) == b"there"
    first, second = server.requests[0].headers, other.requests[0].headers
    assert all(first.get(name) == value for name, value in SECRETS.items())
    assert not set(SECRETS) & set(second), second
    assert second["X-Trace"] == "plain"


def test_a_redirect_within_the_origin_keeps_the_headers(http_server):
    server = http_server({"obj": b"here"}, Faults(script={"start": ["redirect:/obj"]}))
    source = HTTPSource([server.url("start")], headers=SECRETS)
    assert read(source) == b"here"
    assert [r.path for r in server.requests] == ["start", "obj"]
    assert all(server.requests[1].headers.get(k) == v for k, v in SECRETS.items())


def test_a_redirect_loop_ends_with_a_permanent_error_naming_it(http_server):
    loop = {"a": ["redirect:/b"] * 50, "b": ["redirect:/a"] * 50}
    server = http_server({}, Faults(script=loop))
    source = HTTPSource([server.url("a")], retry=FAST)
    with pytest.raises(FetchError, match=r"after 1 attempt.*more than 10 redirects"):
        read(source)
    assert len(server.requests) == 11  # the first, then 10 redirects followed


@pytest.mark.parametrize(
    ("url", "location", "secret", "expected"),
    [
        ("https://a.test/x", "/y", True, ("https://a.test/y", True)),
        ("https://a.test/x", "https://a.test:8443/y", True, ("https://a.test:8443/y", False)),
        ("http://a.test/x", "https://a.test/y", True, ("https://a.test/y", False)),
        ("https://a.test/x", "http://a.test/y", False, ("http://a.test/y", False)),
        ("https://a.test/x", "http://a.test/y", True, "to http:// refused"),
        ("https://a.test/x", "ftp://a.test/y", False, "not an http"),
    ],
)
def test_each_hop_keeps_secrets_on_the_origin_and_refuses_a_credentialed_downgrade(
    url, location, secret, expected
):
    """``next_hop(url, location, origin_kept, secrets)``: the next URL and whether the
    secret headers go with it; https -> http with secrets is refused."""
    if isinstance(expected, str):
        with pytest.raises(Permanent, match=expected):
            _http.next_hop(url, location, url, secret)
        return
    hop, keep = _http.next_hop(url, location, url, secret)
    assert (str(hop), keep) == expected


# Item 6: a stream has a total deadline, not only one between bytes.


def test_a_trickling_stream_is_cut_and_retried(http_server):
    """One byte every 20 ms keeps under timeout=0.2 between bytes; the request is cut at its
    pace budget and the retry delivers the shard."""
    shards = shard_set(1, 3)
    name = next(iter(shards))
    server = http_server(shards, Faults(script={name: ["trickle:0.02"]}))
    source = ShardedSource([server.url(name)], samples_per_shard=[3], timeout=0.2, retry=FAST)
    assert sorted(stream(source)) == [f"s000-{i:04d}" for i in range(3)]
    assert [r.fault for r in server.requests] == ["trickle:0.02", "ok"]


def test_a_stream_that_only_trickles_fails_at_the_retry_deadline(http_server):
    shards = shard_set(1, 3)
    name = next(iter(shards))
    server = http_server(shards, Faults(script={name: ["trickle:0.02"] * 100}))
    retry = Retry(attempts=None, backoff=0.001, max_backoff=0.01, deadline=0.5)
    source = ShardedSource([server.url(name)], samples_per_shard=[3], timeout=0.1, retry=retry)
    began = time.monotonic()
    with pytest.raises(FetchError, match=r"too slow.*deadline=0.5"):
        stream(source)
    assert time.monotonic() - began < 2.0


# Item 10a: Retry-After as RFC 9110 has it.


def test_retry_after_is_delta_seconds_or_an_http_date_and_nothing_else():
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert _http.parse_retry_after("3", now) == 3.0
    assert _http.parse_retry_after(" 12 ", now) == 12.0
    assert _http.parse_retry_after(date, now) == 7.0
    assert _http.parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0
    assert _http.parse_retry_after("9" * 400, now) == 86400.0  # capped, not inf
    for bad in ["²", "٣", "1.5", "-1", "", "soon", "Mon, 99 Foo 2024 00:00:00 GMT"]:
        assert _http.parse_retry_after(bad, now) is None, bad


@pytest.mark.parametrize("after", ["²", "soon", "1e3"])
def test_a_malformed_retry_after_falls_back_to_the_backoff(http_server, after):
    """A 503 whose Retry-After is not RFC 9110's is still a 503: retried."""
    server = http_server({"obj": b"body"}, Faults(script={"obj": [f"503:{after}"]}))
    assert read(HTTPSource([server.url("obj")], retry=FAST)) == b"body"
    assert [r.fault for r in server.requests] == [f"503:{after}", "ok"]


# Item 10d: a body whose end cannot be verified is not accepted.


def test_a_close_delimited_body_is_refused_as_unverifiable(http_server):
    """No Content-Length, not chunked: a clean close may be a cut; refused, not retried."""
    body = bytes(range(256)) * 64
    server = http_server({"obj": body}, Faults(script={"obj": ["close:1000"]}))
    with pytest.raises(FetchError, match=r"after 1 attempt.*close-delimited"):
        read(HTTPSource([server.url("obj")], retry=FAST))


def test_a_cut_chunked_body_is_retried_and_a_whole_one_accepted(http_server):
    body = bytes(range(256)) * 64
    script = {"obj": ["chunked-cut:1000", "chunked"]}
    server = http_server({"obj": body}, Faults(script=script))
    assert read(HTTPSource([server.url("obj")], retry=FAST)) == body
    assert [r.fault for r in server.requests] == ["chunked-cut:1000", "chunked"]


def test_a_ranged_close_delimited_body_is_checked_by_its_length(http_server):
    """A Range item knows its length: a close-delimited 206 of that length is accepted."""
    body = bytes(range(256)) * 64
    server = http_server({"obj": body}, Faults(script={"obj": ["close"]}))
    assert read(HTTPSource([(server.url("obj"), 100, 500)])) == body[100:600]
