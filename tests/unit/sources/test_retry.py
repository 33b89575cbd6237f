"""The retry policy: what is transient, how long to wait, when to give up; redaction."""

import asyncio
import math
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
    with pytest.raises(ValueError, match=r"max_backoff=0.1 must be >= backoff=1 and finite"):
        Retry(backoff=1, max_backoff=0.1)
    with pytest.raises(ValueError, match=r"max_backoff=inf must be >= backoff=0.1 and finite"):
        Retry(max_backoff=math.inf)
    for bad in (0, -1.5, math.nan):
        with pytest.raises(ValueError, match=rf"deadline={bad} must be > 0 or None"):
            Retry(deadline=bad)
    with pytest.raises(ValueError, match="attempts=None and deadline=None would retry forever"):
        Retry(attempts=None, deadline=None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 2.5}, "attempts must be an int or None, got float"),
        ({"attempts": True}, "attempts must be an int or None, got bool"),
        ({"backoff": "0.1"}, "backoff must be a number of seconds, got str"),
        ({"max_backoff": None}, "max_backoff must be a number of seconds, got NoneType"),
        ({"deadline": "60"}, "deadline must be a number of seconds or None, got str"),
        ({"deadline": False}, "deadline must be a number of seconds or None, got bool"),
    ],
)
def test_retry_rejects_arguments_of_the_wrong_type(kwargs, message):
    """A TypeError naming the argument and the type it got."""
    with pytest.raises(TypeError, match=message):
        Retry(**kwargs)


def test_default_policy_is_deadline_based_with_attempts_as_a_secondary_bound():
    """Retry() retries for up to a minute per object, at most 50 requests in a row; the
    positional order of the earlier arguments still holds."""
    assert Retry() == Retry(attempts=50, backoff=0.1, max_backoff=5.0, deadline=60.0)
    assert Retry(3, 0.001) == Retry(attempts=3, backoff=0.001, max_backoff=5.0, deadline=60.0)
    assert Retry(attempts=None).attempts is None and Retry(deadline=None).deadline is None
    assert pickle.loads(pickle.dumps(Retry(deadline=5))) == Retry(deadline=5)


class FakeTime:
    """A monotonic clock that only `sleep` advances, and a log of the waits."""

    def __init__(self):
        self.now = 100.0
        self.waits = []

    def clock(self):
        return self.now

    async def sleep(self, seconds):
        self.waits.append(seconds)
        self.now += seconds


def fake_attempts(policy, fake, uniform=lambda a, b: b):
    """Attempts on `fake` time; by default the jitter draws the cap (the longest wait)."""
    return Attempts("u", policy, Redactor(), clock=fake.clock, sleep=fake.sleep, uniform=uniform)


async def fail_until_given_up(attempts, exc, request_s=0.0, fake=None):
    """Calls `failed` until it raises; each request takes `request_s` of fake time."""
    while True:
        if fake is not None:
            fake.now += request_s
        await attempts.failed(exc)


def test_deadline_ends_retrying_before_a_wait_would_pass_it():
    """No wait ends past `deadline` after the streak's first failure; the error says so."""
    fake = FakeTime()
    policy = Retry(attempts=None, backoff=1, max_backoff=4, deadline=30)
    attempts = fake_attempts(policy, fake)
    with pytest.raises(FetchError, match="gave up after 9 attempt") as info:
        asyncio.run(fail_until_given_up(attempts, Transient("reset")))
    assert fake.waits == [1, 2, 4, 4, 4, 4, 4, 4]  # 27 s; one more 4 s wait would end at 31 s
    assert info.value.reason == (
        "retry gave up after 9 failures in a row over 27s: "
        "the next wait (4s) would pass deadline=30s"
    )
    assert str(info.value).endswith(f"({info.value.reason})")


def test_deadline_counts_request_time_after_the_first_failure():
    """Time spent in requests after the first failure counts towards the deadline."""
    fake = FakeTime()
    attempts = fake_attempts(Retry(attempts=None, backoff=1, max_backoff=1, deadline=10), fake)
    with pytest.raises(FetchError, match="gave up after 5 attempt"):
        asyncio.run(fail_until_given_up(attempts, Transient("slow"), request_s=1.5, fake=fake))
    assert fake.waits == [1, 1, 1, 1]  # failures at 0, 2.5, 5, 7.5, 10 s after the first


def test_attempts_bound_ends_retrying_before_the_deadline():
    """Retry(attempts=3) makes at most 3 requests in a row, however far the deadline is."""
    fake = FakeTime()
    attempts = fake_attempts(Retry(attempts=3, backoff=0.01), fake)
    with pytest.raises(FetchError, match="gave up after 3 attempt") as info:
        asyncio.run(fail_until_given_up(attempts, Transient("reset")))
    assert len(fake.waits) == 2
    assert info.value.reason == "retry gave up: attempts=3 requests in a row failed"


def test_a_permanent_failure_is_reported_as_not_retried():
    """A permanent failure raises at once, saying it was not retried."""
    fake = FakeTime()
    with pytest.raises(FetchError) as info:
        asyncio.run(fake_attempts(Retry(), fake).failed(FileNotFoundError("gone")))
    assert fake.waits == []
    assert info.value.reason == "not retried: the failure is permanent"


def test_retry_after_is_honoured_capped_at_max_backoff_and_within_the_deadline():
    """Retry-After sets the least wait, up to max_backoff; one past the deadline ends it."""
    fake = FakeTime()
    attempts = fake_attempts(Retry(backoff=0.1, max_backoff=5, deadline=12), fake, lambda a, b: a)

    async def run():
        await attempts.failed(Transient("busy", retry_after=2.5))
        await attempts.failed(Transient("busy", retry_after=600))
        await attempts.failed(Transient("busy"))
        await attempts.failed(Transient("busy", retry_after=5))  # 7.5 + 5 > 12: give up

    with pytest.raises(FetchError, match="gave up after 4 attempt"):
        asyncio.run(run())
    assert fake.waits == [2.5, 5, 0]


def test_jitter_is_drawn_below_the_capped_exponential_bound():
    """Wait n is drawn from uniform(0, min(max_backoff, backoff * 2**(n-1))), then used as is."""
    fake, draws = FakeTime(), []

    def uniform(a, b):
        draws.append((a, b))
        return b * 0.375

    attempts = fake_attempts(Retry(attempts=8, backoff=0.5, max_backoff=3), fake, uniform)
    with pytest.raises(FetchError):
        asyncio.run(fail_until_given_up(attempts, Transient("reset")))
    assert draws == [(0, 0.5), (0, 1.0), (0, 2.0), (0, 3), (0, 3), (0, 3), (0, 3)]
    assert fake.waits == [b * 0.375 for _, b in draws]


def test_a_long_streak_never_overflows_the_backoff():
    """Thousands of failures in a row (attempts=None) keep waits at max_backoff."""
    policy = Retry(attempts=None, backoff=0.1, max_backoff=2.0, deadline=1e9)
    assert 0 <= policy.delay(5000) <= 2.0
    assert policy.delay(5000, uniform=lambda a, b: b) == 2.0


def test_progress_restarts_the_deadline_and_slow_consumers_are_not_charged():
    """A stream that delivers data between failures is retried for as long as it progresses,
    and time spent before a streak's first failure does not count towards its deadline."""
    fake = FakeTime()
    attempts = fake_attempts(Retry(attempts=None, backoff=1, max_backoff=1, deadline=5), fake)

    async def run():
        for _ in range(20):  # 20 streaks of 3 failures: 60 s of retrying in all
            fake.now += 1000  # data flowed, then the consumer held the stream back
            for _ in range(3):
                await attempts.failed(Transient("reset"))
            attempts.progressed()
        await fail_until_given_up(attempts, Transient("reset"))

    with pytest.raises(FetchError, match="gave up after 66 attempt") as info:
        asyncio.run(run())
    assert "after 6 failures in a row over 5s" in info.value.reason


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
        ("https://u:pw1234@h:8/x", "https://***:***@h:8/x"),
        ("https://u@h/x", "https://***@h/x"),
        ("https://h/x?X-Amz-Signature=abc&X-Amz-Credential=def", "https://h/x?X-Amz-Signature=***&X-Amz-Credential=***"),
    ],
)  # fmt: skip
def test_redact_url_hides_passwords_and_query_values(url, shown):
    """URLs are shown without their user-info (user and password) and query values."""
    assert redact_url(url) == shown


def test_option_secrets_finds_credentials_at_any_depth():
    """Storage options named like credentials are secrets; endpoints are not."""
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "wJalrEXAMPLE",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": "tok0"},
    }
    assert sorted(option_secrets(options)) == ["AKIAEXAMPLE", "tok0", "wJalrEXAMPLE"]
