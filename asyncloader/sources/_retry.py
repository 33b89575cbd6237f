"""The retry policy shared by every source: which failures are retried, how long to wait, when
to give up.

Transient (retried): HTTP 5xx and 429 (and 408), connection errors and resets, timeouts,
truncated bodies. Everything else is permanent and fails at once: other 4xx, a missing key, a
refused credential, an object over the size limit. Waits grow exponentially with full jitter,
``uniform(0, min(max_backoff, backoff * 2**(n-1))`` before retry ``n``, and never undercut a
server's ``Retry-After`` (capped at ``max_backoff``). The budget is ``attempts`` requests in a
row that made no progress; a stream that delivered data since its last failure starts a new
streak (so a long shard survives occasional resets), and the error counts every request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

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


@dataclass(frozen=True, slots=True)
class Retry:
    """How a source retries transient failures.

    Args:
        attempts: Requests in a row without progress before giving up (1: no retries).
        backoff: Seconds; the cap of the first wait (full jitter below it).
        max_backoff: Seconds; no wait is longer.
    """

    attempts: int = 5
    backoff: float = 0.1
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts must be an int, got {type(self.attempts).__qualname__}")
        if self.attempts < 1:
            raise ValueError(f"attempts={self.attempts} must be >= 1")
        if self.backoff < 0:
            raise ValueError(f"backoff={self.backoff} must be >= 0")
        if self.max_backoff < self.backoff:
            raise ValueError(f"max_backoff={self.max_backoff} must be >= backoff={self.backoff}")

    def delay(self, streak: int, retry_after: float | None = None) -> float:
        """Seconds to wait before the retry that follows ``streak`` failures in a row."""
        cap = min(self.max_backoff, self.backoff * 2 ** (streak - 1))
        wait = random.uniform(0, cap)
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
    """

    def __init__(
        self,
        target: str | Callable[[], str],
        policy: Retry,
        redact: Redactor | Callable[[], Redactor],
    ) -> None:
        self._target = target
        self._redact = redact
        self.policy = policy
        self.total = 0
        self.streak = 0

    # Naming the target and building its redactor cost more than a successful read's own
    # bookkeeping, and only failures need them: they may be given as callables, resolved once.
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

    async def failed(self, exc: Exception) -> None:
        """Waits before the next attempt, or raises FetchError when retrying is over.

        Raises:
            FetchError: ``exc`` is permanent or the streak reached ``policy.attempts``.
        """
        self.total += 1
        self.streak += 1
        cause = describe_cause(exc, self.redact)
        if not is_transient(exc) or self.streak >= self.policy.attempts:
            error = FetchError(self.target, self.total, cause)
            plain = "".join(describe_cause(e, Redactor()) for e in _chain(exc))
            if self.redact.holds_secret(plain):
                raise error from None
            raise error from exc
        wait = self.policy.delay(self.streak, retry_after(exc))
        log.debug("retrying %s in %.3fs after attempt %d: %s", self.target, wait, self.total, cause)
        await asyncio.sleep(wait)


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
