"""The retry policy shared by every source: which failures are retried, how long to wait, when
to give up.

Transient (retried): HTTP 5xx and 429 (and 408), connection errors and resets, timeouts,
truncated bodies. Everything else is permanent and fails at once: other 4xx, a missing key, a
refused credential, an object over the size limit. Waits grow exponentially with full jitter,
``uniform(0, min(max_backoff, backoff * 2**(n-1)))`` before retry ``n``, and never undercut a
server's ``Retry-After`` (capped at ``max_backoff``).

Retrying is counted per streak: the requests for one object that failed in a row. A stream
that delivered data since its last failure starts a new streak (so a long shard survives
occasional resets); the error counts every request. A streak ends with FetchError at
whichever bound comes first: ``attempts`` requests, or a wait that would end past
``deadline`` seconds after the streak's first failure (the time before that failure is not
counted: a stream held back by a slow consumer is not charged for it)::

    F1 ~wait~ F2 ~~wait~~ F3 ~~~~wait~~~~ F4 ~~~~~~wait~~~~~~|~~> gives up at F4
    ^ first failure of the streak                            ^ first failure + deadline
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from asyncloader._base import RETRIES, tracing
from asyncloader.errors import FetchError
from asyncloader.sources._redact import Redactor

T = TypeVar("T")
log = logging.getLogger("asyncloader.sources")

# Exception classes of aiohttp and botocore that mean "the transport failed": matched by name
# so that this module imports neither (both are optional dependencies).
_TRANSIENT_NAMES = frozenset(
    {
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "HTTPClientError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ConnectionClosedError",
    }
)
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
)
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class Transient(Exception):
    """A failure worth retrying that has no exception type of its own (a truncated body).

    Args:
        message: What went wrong.
        retry_after: Seconds the server asked to wait, if it did.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Permanent(Exception):
    """A failure that retrying cannot fix (an object over the size limit, a 4xx status)."""


def _check_type(name: str, value: object, kinds: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, got {type(value).__qualname__}")


@dataclass(frozen=True, slots=True)
class Retry:
    """How a source retries transient failures: capped exponential backoff with full jitter,
    until a deadline per object (per streak, for streams) or an attempt count, whichever first.

    Both bounds always apply: ``Retry(attempts=3)`` makes at most 3 requests in a row and
    still stops at the deadline; set one of them to None to rely on the other alone.

    Args:
        attempts: Most requests in a row without progress (1: no retries); None: no count.
            By default a secondary bound that the deadline reaches first unless requests fail
            faster than the backoff.
        backoff: Seconds; the cap of the first wait (full jitter below it), doubling per retry.
        max_backoff: Seconds; no wait is longer, a server's ``Retry-After`` included.
        deadline: Seconds after a streak's first failure within which every wait must end;
            no retry starts that would end later. None: no deadline.

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: An impossible value, or neither ``attempts`` nor ``deadline`` bounding.
    """

    attempts: int | None = 50
    backoff: float = 0.1
    max_backoff: float = 5.0
    deadline: float | None = 60.0

    def __post_init__(self) -> None:
        _check_type("attempts", self.attempts, int | None, "an int or None")
        _check_type("backoff", self.backoff, int | float, "a number of seconds")
        _check_type("max_backoff", self.max_backoff, int | float, "a number of seconds")
        _check_type("deadline", self.deadline, int | float | None, "a number of seconds or None")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts={self.attempts} must be >= 1")
        if not self.backoff >= 0:
            raise ValueError(f"backoff={self.backoff} must be >= 0")
        if not self.backoff <= self.max_backoff < math.inf:
            raise ValueError(
                f"max_backoff={self.max_backoff} must be >= backoff={self.backoff} and finite"
            )
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"deadline={self.deadline} must be > 0 or None")
        if self.attempts is None and self.deadline is None:
            raise ValueError("attempts=None and deadline=None would retry forever: set one")

    def delay(
        self,
        streak: int,
        retry_after: float | None = None,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> float:
        """Seconds to wait before the retry that follows ``streak`` failures in a row.

        Args:
            streak: Failures in a row so far (>= 1).
            retry_after: Seconds the server asked to wait, if it did.
            uniform: ``uniform(a, b)``, the jitter's draw (``random.uniform``).
        """
        # The exponent is bounded: past 2**64 every cap is max_backoff, and 2**n of a huge n
        # overflows a float (a long streak under attempts=None).
        cap = min(self.max_backoff, self.backoff * 2.0 ** min(streak - 1, 64))
        wait = uniform(0, cap)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_backoff))
        return wait


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> int | None:
    """The HTTP status an aiohttp or botocore error carries, if any."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and 100 <= status <= 599:
        return status
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        code = (response.get("Error") or {}).get("Code")
        if code in _TRANSIENT_CODES:
            return 503
        status = meta.get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def status_of(exc: BaseException) -> int | None:
    """The first HTTP status found along the cause chain of ``exc``."""
    for e in _chain(exc):
        status = _status(e)
        if status is not None:
            return status
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying might help: walks the cause chain for the first verdict."""
    for e in _chain(exc):
        if isinstance(e, Transient):
            return True
        if isinstance(e, (Permanent, *_PERMANENT)):
            return False
        status = _status(e)
        if status is not None:
            return status >= 500 or status in (408, 429)
        if isinstance(e, TimeoutError | ConnectionError):
            return True
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(e).__mro__):
            return True
    return False


def retry_after(exc: BaseException) -> float | None:
    """The wait a server asked for (``Retry-After`` in seconds), if any."""
    for e in _chain(exc):
        value = getattr(e, "retry_after", None)
        if isinstance(value, int | float):
            return float(value)
    return None


def describe_cause(exc: BaseException, redact: Redactor) -> str:
    """``TypeName: message`` of ``exc``, redacted."""
    text = str(exc)
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class Attempts:
    """Counts requests for one object and decides, after each failure, to wait or give up.

    Args:
        target: The redacted URL, key or path, for messages (or a callable making it).
        policy: The retry policy.
        redact: Scrubs secrets from causes (or a callable making it).
        clock: Monotonic seconds (``time.monotonic``); injectable for tests.
        sleep: Awaitable sleep (``asyncio.sleep``); injectable for tests.
        uniform: The jitter's draw (``random.uniform``); injectable for tests.
    """

    def __init__(
        self,
        target: str | Callable[[], str],
        policy: Retry,
        redact: Redactor | Callable[[], Redactor],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self._target = target
        self._redact = redact
        self._clock = clock
        self._sleep = sleep
        self._uniform = uniform
        self.policy = policy
        self.total = 0
        self.streak = 0
        self._since = 0.0  # clock() at the streak's first failure

    # Naming the target and building its redactor cost more than a successful read's own
    # bookkeeping, and only failures need them: they may be given as callables, resolved once.
    # The clock, likewise, is read only on failures.
    @functools.cached_property
    def target(self) -> str:
        return self._target() if callable(self._target) else self._target

    @functools.cached_property
    def redact(self) -> Redactor:
        # A Redactor is itself callable (it scrubs text): tell it from a factory by type.
        return self._redact if isinstance(self._redact, Redactor) else self._redact()

    def progressed(self) -> None:
        """Data arrived since the last failure: the next failure starts a new streak."""
        self.streak = 0

    def _verdict(self, exc: Exception, now: float) -> tuple[float, str | None]:
        """The wait before the next attempt, and why there is none (None: retry)."""
        policy = self.policy
        if not is_transient(exc):
            return 0.0, "not retried: the failure is permanent"
        if policy.attempts is not None and self.streak >= policy.attempts:
            return 0.0, f"retry gave up: attempts={policy.attempts} requests in a row failed"
        wait = policy.delay(self.streak, retry_after(exc), uniform=self._uniform)
        elapsed = now - self._since
        if policy.deadline is not None and elapsed + wait > policy.deadline:
            return wait, (
                f"retry gave up after {self.streak} failures in a row over {elapsed:.3g}s: "
                f"the next wait ({wait:.3g}s) would pass deadline={policy.deadline}s"
            )
        return wait, None

    async def failed(self, exc: Exception) -> None:
        """Waits before the next attempt, or raises FetchError when retrying is over.

        Raises:
            FetchError: ``exc`` is permanent, the streak made ``policy.attempts`` requests, or
                the next wait would end past ``policy.deadline`` after the streak's first
                failure. Its ``reason`` says which.
        """
        self.total += 1
        self.streak += 1
        now = self._clock()
        if self.streak == 1:
            self._since = now
        cause = describe_cause(exc, self.redact)
        wait, ended = self._verdict(exc, now)
        if ended is not None:
            error = FetchError(self.target, self.total, cause, ended)
            plain = "".join(describe_cause(e, Redactor()) for e in _chain(exc))
            if self.redact.holds_secret(plain):
                raise error from None
            raise error from exc
        log.debug("retrying %s in %.3fs after attempt %d: %s", self.target, wait, self.total, cause)
        RETRIES[0] += 1
        retry = {"target": self.target, "attempt": self.total, "wait_s": wait, "cause": cause}
        tracing.instant("retry", "source", retry)  # target and cause are redacted
        await self._sleep(wait)


async def retrying(op: Callable[[], Awaitable[T]], attempts: Attempts) -> T:
    """Awaits ``op()`` until it succeeds or ``attempts`` gives up (raising FetchError)."""
    while True:
        try:
            return await op()
        except Exception as exc:
            await attempts.failed(exc)


def check_size(size: Any, limit: int | None, target: str | Callable[[], str]) -> None:
    """Raises Permanent when ``size`` is over ``limit`` (the configured maximum object size).

    ``target`` may be a callable, so that naming it costs nothing when the size is fine.
    """
    if limit is not None and size is not None and int(size) > limit:
        name = target() if callable(target) else target
        raise Permanent(f"{name} is {int(size)} bytes, over max_object_size={limit}")
