"""Redaction: the process-wide registry of redactors (secrets to hide) and the scrubbing of
an exception and its chain.

Sources register their redactors here (:func:`register_redactor`, held weakly, so a source's
secrets are hidden exactly while it lives). Every string a failure carries passes through
each live one (:func:`redact_text`): the exception's args, notes and attributes, its
cause/context chain (:func:`redact_exception`), the traceback text sent to the training
process and, on the library's loggers, each record (:class:`RedactingFilter`). The registry's
lock is renewed in a forked child, so a fork never inherits it held.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from asyncloader.errors import RedactedError

_PLAIN = (int, float, bool, type(None))

Redact = Callable[[str], str]
_redactors: weakref.WeakSet[Any] = weakref.WeakSet()
_redactors_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A fork while another thread held the lock would leave the child's copy held forever."""
    global _redactors_lock
    _redactors_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def register_redactor(redactor: Redact) -> None:
    """Has every failure's text pass through ``redactor`` for as long as it lives."""
    with _redactors_lock:
        _redactors.add(redactor)


def redact_text(text: str) -> str:
    """``text`` through every live registered redactor (unchanged when there is none)."""
    with _redactors_lock:
        live = list(_redactors)
    for redact in live:
        text = redact(text)
    return text


def redacting() -> bool:
    """Whether a redactor is registered (a source of :mod:`asyncloader.sources` lives)."""
    return bool(_redactors)


def _shown_arg(value: Any) -> Any:
    """A log argument as it may be shown: itself, or its text redacted when that differs."""
    if isinstance(value, _PLAIN):
        return value
    text = value if isinstance(value, str) else _text(value)
    hidden = redact_text(text)
    return value if hidden == text else hidden


class RedactingFilter(logging.Filter):
    """Passes each record's message, arguments (kept as they are where they hold no secret)
    and traceback text through :func:`redact_text`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not redacting():
            return True
        record.msg = _shown_arg(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_shown_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _shown_arg(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def redact_exception(exc: BaseException, redact: Redact) -> None:
    """Passes every string ``exc`` shows through ``redact``, in place.

    ``exc`` keeps its type (it is what the user catches): its args, notes and attributes are
    redacted (a non-string attribute whose repr held a secret becomes that repr, redacted).
    In its cause/context chain and group members, an exception whose text or attributes held
    a secret is replaced by a :class:`RedactedError` naming its type; the others stay, their
    notes redacted. Cycles in the chain are followed once.
    """
    _redact_in_place(exc, redact)
    _relink(exc, redact, {id(exc): exc})


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return "<unrepresentable>"


def _text(value: object) -> str:
    try:
        return str(value)
    except Exception:
        return "<unprintable>"


def _clean(value: Any, redact: Redact) -> Any:
    """``value`` redacted: a string through ``redact``; another value as its redacted repr
    when that repr held a secret, else itself."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, _PLAIN):
        return value
    shown = _repr(value)
    hidden = redact(shown)
    return value if hidden == shown else hidden


def _redact_notes(exc: BaseException, redact: Redact) -> None:
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        exc.__notes__ = [redact(n) if isinstance(n, str) else n for n in notes]


def _redact_in_place(exc: BaseException, redact: Redact) -> None:
    if not isinstance(exc, BaseExceptionGroup):  # a group's args are its members
        args = tuple(_clean(a, redact) for a in exc.args)
        if any(a is not b for a, b in zip(args, exc.args, strict=True)):
            exc.args = args
    state = vars(exc)
    for name, value in list(state.items()):
        if name != "__notes__":
            state[name] = _clean(value, redact)
    if isinstance(exc, OSError):  # shown by str(), kept outside args and vars
        for name in ("strerror", "filename", "filename2"):
            value = getattr(exc, name)
            if isinstance(value, str):
                setattr(exc, name, redact(value))
    _redact_notes(exc, redact)


def _shows_secret(exc: BaseException, redact: Redact) -> bool:
    args = exc.args[:1] if isinstance(exc, BaseExceptionGroup) else exc.args
    values = [v for k, v in vars(exc).items() if k != "__notes__"]
    shown = "\n".join([_text(exc), *map(_repr, args), *map(_repr, values)])
    return redact(shown) != shown


def _stand_in(exc: BaseException, redact: Redact) -> BaseException:
    """A RedactedError in place of ``exc``: its type's name, its message redacted, its
    traceback, notes and chain."""
    cls = type(exc)
    status = getattr(exc, "status", None)
    new = RedactedError(
        f"{cls.__module__}.{cls.__qualname__}",
        redact(_text(exc)),
        status if isinstance(status, int) and not isinstance(status, bool) else None,
    )
    _adopt(new, exc)
    _redact_notes(new, redact)
    return new


def _adopt(new: BaseException, old: BaseException) -> None:
    """Gives ``new`` the traceback, notes and chain of ``old``."""
    new.__traceback__ = old.__traceback__
    new.__cause__, new.__context__ = old.__cause__, old.__context__
    new.__suppress_context__ = old.__suppress_context__
    if hasattr(old, "__notes__"):
        new.__notes__ = list(old.__notes__)


def _redacted(exc: BaseException, redact: Redact, memo: dict[int, BaseException]) -> BaseException:
    """``exc`` as it may stay in a chain: itself (notes redacted) or its stand-in."""
    if id(exc) in memo:
        return memo[id(exc)]
    if _shows_secret(exc, redact):
        new = memo[id(exc)] = _stand_in(exc, redact)
    else:
        new = memo[id(exc)] = exc
        _redact_notes(exc, redact)
        if isinstance(exc, BaseExceptionGroup):
            members = [_redacted(m, redact, memo) for m in exc.exceptions]
            if any(m is not o for m, o in zip(members, exc.exceptions, strict=True)):
                new = memo[id(exc)] = exc.derive(members)
                _adopt(new, exc)
    _relink(new, redact, memo)
    return new


def _relink(exc: BaseException, redact: Redact, memo: dict[int, BaseException]) -> None:
    """Replaces the links of ``exc`` (cause, context) by their redacted versions."""
    suppress = exc.__suppress_context__  # setting __cause__ would set it
    if exc.__cause__ is not None:
        exc.__cause__ = _redacted(exc.__cause__, redact, memo)
    if exc.__context__ is not None:
        exc.__context__ = _redacted(exc.__context__, redact, memo)
    exc.__suppress_context__ = suppress
