"""The retry policy: what is transient, how long to wait, when to give up; redaction."""

import asyncio
import pickle

import pytest

from asyncloader import FetchError
from asyncloader.sources import Retry
from asyncloader.sources._http import HTTPStatusError
from asyncloader.sources._redact import Redactor, option_secrets, redact_url
from asyncloader.sources._retry import Attempts, Permanent, Transient, is_transient, retrying


class ClientError(Exception):
    """Shaped like botocore's ClientError: a response dict with the HTTP status."""

    def __init__(self, status, code="X"):
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ClientPayloadError(Exception):
    """Named like aiohttp's: a body that ended early."""


def wrapped(cause):
    """An OSError raised from `cause`, as s3fs translates botocore errors."""
    try:
        raise OSError(5, "translated") from cause
    except OSError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (HTTPStatusError(503, "Service Unavailable"), True),
        (HTTPStatusError(500, "Internal"), True),
        (HTTPStatusError(429, "Too Many Requests"), True),
        (HTTPStatusError(404, "Not Found"), False),
        (HTTPStatusError(403, "Forbidden"), False),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (ClientPayloadError("Response payload is not completed"), True),
        (Transient("truncated"), True),
        (Permanent("too big"), False),
        (FileNotFoundError("gone"), False),
        (PermissionError("denied"), False),
        (wrapped(ClientError(503)), True),
        (wrapped(ClientError(200, "SlowDown")), True),
        (wrapped(ClientError(400)), False),
        (ValueError("a bug"), False),
    ],
)
def test_transient_classification(exc, transient):
    """5xx, 429, resets, timeouts and truncation are retried; 4xx and local errors are not."""
    assert is_transient(exc) is transient


def test_backoff_is_exponential_with_full_jitter_capped_and_honours_retry_after():
    """Waits stay within [0, min(max_backoff, backoff * 2**(n-1))], at least Retry-After."""
    policy = Retry(attempts=10, backoff=0.1, max_backoff=1.0)
    for streak, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.0), (9, 1.0)]:
        waits = [policy.delay(streak) for _ in range(200)]
        assert all(0 <= w <= cap for w in waits) and max(waits) > cap / 2
    assert all(policy.delay(1, retry_after=0.5) >= 0.5 for _ in range(50))
    assert policy.delay(1, retry_after=60) <= 1.0


def test_retry_validates_its_arguments():
    """Exact messages for impossible policies."""
    with pytest.raises(ValueError, match="attempts=0 must be >= 1"):
        Retry(attempts=0)
    with pytest.raises(ValueError, match="backoff=-1 must be >= 0"):
        Retry(backoff=-1)
    with pytest.raises(ValueError, match=r"max_backoff=0.1 must be >= backoff=1"):
        Retry(backoff=1, max_backoff=0.1)


def test_progress_starts_a_new_streak_but_total_attempts_are_reported():
    """A stream that makes progress between failures is not given up on; FetchError counts all."""

    async def run():
        attempts = Attempts("u", Retry(attempts=2, backoff=0), Redactor())
        for _ in range(5):
            await attempts.failed(Transient("reset"))
            attempts.progressed()
        with pytest.raises(FetchError, match="gave up after 7 attempt"):
            await attempts.failed(Transient("reset"))
            await attempts.failed(Transient("reset"))

    asyncio.run(run())


def test_retrying_stops_at_a_permanent_error_and_chains_it():
    """A permanent failure raises FetchError at once, with the failure as its cause."""
    calls = []

    async def op():
        calls.append(1)
        raise FileNotFoundError("no such key")

    with pytest.raises(FetchError) as info:
        asyncio.run(retrying(op, Attempts("s3://b/k", Retry(), Redactor())))
    assert len(calls) == 1 and info.value.attempts == 1
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert info.value.cause == "FileNotFoundError: no such key"


def test_a_cause_holding_a_secret_is_not_chained():
    """When the cause's text holds a secret, it is redacted and not attached."""

    async def op():
        raise PermissionError("signature for key SECRETVALUE123 does not match")

    with pytest.raises(FetchError) as info:
        asyncio.run(retrying(op, Attempts("s3://b/k", Retry(), Redactor(["SECRETVALUE123"]))))
    assert info.value.__cause__ is None and "SECRETVALUE123" not in str(info.value)
    assert "***" in info.value.cause


def test_fetch_error_pickles_with_its_attributes():
    """FetchError survives a process boundary."""
    err = pickle.loads(pickle.dumps(FetchError("http://h/x", 3, "HTTP 503")))
    assert (err.target, err.attempts, err.cause) == ("http://h/x", 3, "HTTP 503")
    assert str(err) == "http://h/x: gave up after 3 attempt(s); last cause: HTTP 503"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h/a/b.tar", "https://h/a/b.tar"),
        ("https://u:pw1234@h:8/x", "https://u:***@h:8/x"),
        ("https://u@h/x", "https://u@h/x"),
        ("https://h/x?X-Amz-Signature=abc&X-Amz-Credential=def", "https://h/x?X-Amz-Signature=***&X-Amz-Credential=***"),
    ],
)  # fmt: skip
def test_redact_url_hides_passwords_and_query_values(url, shown):
    """URLs are shown without their password and query values."""
    assert redact_url(url) == shown


def test_option_secrets_finds_credentials_at_any_depth():
    """Storage options named like credentials are secrets; endpoints are not."""
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "wJalrEXAMPLE",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": "tok0"},
    }
    assert sorted(option_secrets(options)) == ["AKIAEXAMPLE", "tok0", "wJalrEXAMPLE"]
