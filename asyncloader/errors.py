"""The exceptions asyncloader raises itself.

Exceptions raised by user code (``__getitem__``, ``transform``, ``collate_fn``) are never
wrapped: they reach the consumer with their own type, a note naming the stage and the sample
indices, and, when they were raised in a worker process, the worker's traceback as their
``__cause__`` (a :class:`RemoteTraceback`).
"""

from __future__ import annotations


class AsyncLoaderError(Exception):
    """Base class of every exception that asyncloader raises on its own account."""


class LoaderTimeoutError(AsyncLoaderError, TimeoutError):
    """Raised by the consumer's next step when ``timeout > 0`` seconds pass without a batch.

    The message names the batch that was awaited (its sequence number and sample indices).
    The epoch is closed afterwards; iterate the loader again to start a new one.
    """


class WorkerCrashedError(AsyncLoaderError):
    """Raised when a worker process dies (a signal, ``os._exit``) while it holds a batch.

    The pool is discarded; iterating the loader again starts a fresh one.
    """


class FetchError(AsyncLoaderError):
    """Raised by a source in :mod:`asyncloader.sources` when one object cannot be read.

    Either its retry budget was spent on transient failures (5xx, 429, connection resets,
    timeouts, truncated bodies), or the failure is permanent (a 4xx other than 429, a missing
    key, an object over ``max_object_size``), in which case ``attempts`` is the number made so
    far. The message names the URL or key (credentials and query strings redacted), the
    attempts and the last cause; the cause is chained unless its text held a secret.

    Attributes:
        target: The redacted URL, key or path.
        attempts: Requests made for it, the failed last one included.
        cause: ``"TypeName: message"`` of the last failure, redacted.
    """

    def __init__(self, target: str, attempts: int, cause: str) -> None:
        super().__init__(f"{target}: gave up after {attempts} attempt(s); last cause: {cause}")
        self.target = target
        self.attempts = attempts
        self.cause = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.target, self.attempts, self.cause))


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
