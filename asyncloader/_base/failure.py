"""A failed batch, carried through the pipeline in place of the batch and raised in order.

A :class:`Failure` keeps the user's exception with its type, attributes and notes. When it
crosses a process boundary it pickles without calling the exception's constructor, so
exceptions whose ``__init__`` takes extra arguments survive the trip (plain pickling of such
exceptions fails, which breaks ``ProcessPoolExecutor``). While a source's redactor lives
(:mod:`asyncloader._base.redaction`), what a failure carries is redacted with it.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from asyncloader._base.redaction import redact_exception, redact_text, redacting
from asyncloader.errors import RemoteTraceback

_MAX_INDICES_SHOWN = 16


def failure_note(stage: str, seq: int, indices: Sequence[Any], index: Any = None) -> str:
    """The note added to a user exception: which stage failed on which samples."""
    shown = list(indices[:_MAX_INDICES_SHOWN])
    more = f" +{len(indices) - len(shown)} more" if len(indices) > len(shown) else ""
    where = f" index={index!r}" if index is not None else ""
    return f"asyncloader: stage={stage} batch={seq}{where} indices={shown}{more}"


class Failure:
    """Stands in for the result of one batch whose stage raised ``exc``."""

    __slots__ = ("exc", "tb")

    def __init__(self, exc: BaseException, tb: str) -> None:
        self.exc = exc
        self.tb = tb

    @classmethod
    def capture(
        cls, exc: BaseException, stage: str, seq: int, indices: Sequence[Any], index: Any = None
    ) -> Failure:
        """Annotates ``exc`` with the stage and samples and wraps it; while a source's
        redactor lives, ``exc`` and its traceback text are redacted with it."""
        exc.add_note(failure_note(stage, seq, indices, index))
        if not redacting():
            return cls(exc, "".join(traceback.format_exception(exc)))
        redact_exception(exc, redact_text)
        return cls(exc, redact_text("".join(traceback.format_exception(exc))))

    def reraise(self) -> NoReturn:
        """Raises the user's exception in the consumer."""
        raise self.exc

    def __reduce__(self) -> tuple[Any, ...]:
        state = {}
        for key, value in vars(self.exc).items():
            try:
                pickle.dumps(value)
            except Exception:
                value = redact_text(repr(value))
            state[key] = value
        return (_rebuild, (type(self.exc), self.exc.args, state, self.tb))


def _rebuild(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any], tb: str
) -> Failure:
    """Recreates the exception in the receiving process, with the sender's traceback as cause."""
    try:
        exc = cls(*args)
    except Exception:
        exc = cls.__new__(cls, *args)
        exc.args = args
    vars(exc).update(state)
    exc.__cause__ = RemoteTraceback(tb)
    return Failure(exc, tb)


def unwrap_group(exc: BaseException) -> BaseException:
    """The first leaf of a (nested) exception group: the error that started the failure.

    The group's other leaves are not dropped: each is attached to the returned exception as a
    note (``also raised: TypeName: message``), so a second failure in the same TaskGroup is
    still reported. A plain exception is returned as it is.
    """
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = _leaves(exc)
    if not leaves:
        return exc
    first = leaves[0]
    for other in leaves[1:]:
        first.add_note(f"asyncloader: also raised: {type(other).__qualname__}: {other}")
    return first


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for member in exc.exceptions for leaf in _leaves(member)]
    return [exc]
