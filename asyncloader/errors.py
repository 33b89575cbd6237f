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
