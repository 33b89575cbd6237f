"""The exceptions asyncloader raises itself.

Exceptions raised by user code (``__getitem__``, ``transform``, ``collate_fn``) are never
wrapped: they reach the consumer with their own type, a note naming the stage and the sample
indices, and, when they were raised in a worker process, the worker's traceback as their
``__cause__`` (a :class:`RemoteTraceback`).
"""

from __future__ import annotations


class AsyncLoaderError(Exception):
    """Base class of every exception that asyncloader raises on its own account."""


class LoaderTimeoutError(AsyncLoaderError, TimeoutError, RuntimeError):
    """Raised by the consumer's next step when ``timeout > 0`` seconds pass without a batch.

    Raised about ``timeout`` seconds after the wait began, however long the stuck sample takes.
    The message names the batch that was awaited (its sequence number and sample indices).
    The epoch ends: it closes in the background (``close()`` waits for that); iterate the
    loader again to start a new one. A ``RuntimeError``, as DataLoader raises for a timeout.
    """


class WorkerCrashedError(AsyncLoaderError, RuntimeError):
    """Raised when a worker process dies (a signal, ``os._exit``) while it holds a batch.

    The epoch ends and the pool is discarded; iterating the loader again starts a fresh one. A
    ``RuntimeError``, as DataLoader raises for a worker that exited unexpectedly.
    """


class FetchError(AsyncLoaderError):
    """Raised by a source in :mod:`asyncloader.sources` when one object cannot be read.

    Either its retry budget was spent on transient failures (5xx, 429, connection resets,
    timeouts, truncated bodies), or the failure is permanent (a 4xx other than 429, a missing
    key, an object over ``max_object_size``), in which case ``attempts`` is the number made so
    far. The message names the URL or key (user-info and query values hidden), the attempts
    and the last cause. Every string it shows is redacted, its cause/context chain included:
    there an exception whose text or attributes held a credential is a :class:`RedactedError`.

    Attributes:
        target: The redacted URL, key or path.
        attempts: Requests made for it, the failed last one included.
        cause: ``"TypeName: message"`` of the last failure, redacted.
        reason: What ended the retries: the failure is permanent, the attempt count, or the
            deadline (see :class:`asyncloader.sources.Retry`).
    """

    def __init__(self, target: str, attempts: int, cause: str, reason: str = "") -> None:
        message = f"{target}: gave up after {attempts} attempt(s); last cause: {cause}"
        super().__init__(f"{message} ({reason})" if reason else message)
        self.target = target
        self.attempts = attempts
        self.cause = cause
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.target, self.attempts, self.cause, self.reason))


class RedactedError(AsyncLoaderError):
    """Stands in, in the cause/context chain of a failure, for an exception whose text or
    attributes held a credential (aiohttp's errors carry the request's URL and headers).

    It keeps the replaced exception's type name, its message (redacted), its traceback, notes
    and own chain; the exception you catch keeps its type, only its strings are redacted.

    Attributes:
        type_name: ``module.QualName`` of the exception it replaces.
        message: That exception's message, redacted.
        status: The HTTP status it carried, if any.
    """

    def __init__(self, type_name: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.type_name, self.message, self.status))


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process.

    Set as the ``__cause__`` of the re-raised exception so that the user's file and line show
    in the consumer's traceback.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class SourceHeavyWarning(UserWarning):
    """An iterable source's own ``__iter__``/``__next__`` work took a large share of the
    training process (warned once per source, with the fix: ``fetch_in_workers=True``)."""
