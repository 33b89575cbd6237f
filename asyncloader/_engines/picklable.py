"""Whether worker processes started by pickling (spawn, forkserver) can receive an object, and
if not, which part of it fails and how to fix that.

The check pickles each object once into nothing, with the pickler the workers' start uses
(``multiprocessing``'s), so it costs one more pickling of the dataset per epoch that starts
workers (per loader with ``persistent_workers``); array buffers are not copied, and tensors
are not moved to shared memory (they always pickle). Two things pickle here
and still fail in the worker, so they are refused too: a class or function of ``__main__``
when ``__main__`` has no file to re-import (a notebook, ``python -``, ``python -c``).

Only when a check fails is the object walked, following pickle's own reduction of each part,
to name the attribute path of the part that fails (``dataset.f: _io.BufferedReader``).
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any

import torch

from asyncloader._base import forking_reducers

_PROTOCOL = 5  # buffers out of band, so an array's bytes are not copied to be checked
#: Parts of an object walked at most while looking for the one that fails.
_WALK_LIMIT = 10_000


class _Unimportable(Exception):
    """A class or function that a fresh worker process could not import."""


def _main_has_no_file() -> bool:
    main = sys.modules.get("__main__")
    return main is not None and not os.path.isfile(getattr(main, "__file__", None) or "")


class _Checker(pickle.Pickler):
    """Pickles into nothing as ``multiprocessing``'s pickler would; raises
    :class:`_Unimportable` on a class or function of a ``__main__`` that the workers cannot
    re-import."""

    def __init__(self, main_unimportable: bool) -> None:
        super().__init__(_Sink(), _PROTOCOL, buffer_callback=_out_of_band)
        self.dispatch_table = {**copyreg.dispatch_table, **forking_reducers()}
        self._main_unimportable = main_unimportable

    def reducer_override(self, obj: Any) -> Any:
        # Called for everything but builtin scalars and containers: cheap for plain data.
        if isinstance(obj, torch.Tensor | torch.UntypedStorage | torch.TypedStorage):
            return _nothing, ()  # torch's reduction would move it to shared memory
        if (
            self._main_unimportable
            and isinstance(obj, type | types.FunctionType)
            and getattr(obj, "__module__", None) == "__main__"
        ):
            raise _Unimportable(obj)
        return NotImplemented


def _out_of_band(buffer: Any) -> bool:
    return False  # not written: nothing to copy


def _nothing() -> None:
    return None


class _Sink(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)


def _problem(obj: Any, main_unimportable: bool) -> BaseException | None:
    """Why ``obj`` (with all it holds) cannot reach a fresh worker, or ``None``."""
    try:
        _Checker(main_unimportable).dump(obj)
    except _Unimportable as exc:
        return exc
    except RecursionError:
        return None  # too deep to check here; the worker's start will say
    except Exception as exc:
        return exc
    return None


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """``(path suffix, part)`` for what pickling ``obj`` pickles in turn, as pickle reduces it."""
    if isinstance(obj, dict):
        return [(f"[{key!r}]", value) for key, value in obj.items()]
    if isinstance(obj, list | tuple | set | frozenset):
        return [(f"[{i}]", value) for i, value in enumerate(obj)]
    if isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
        return []  # pickled by reference: it is the part that fails, if any
    try:
        reduced = obj.__reduce_ex__(_PROTOCOL)
    except Exception:
        return []
    return _reduced_parts(reduced) if isinstance(reduced, tuple) else []


def _reduced_parts(reduced: tuple[Any, ...]) -> list[tuple[str, Any]]:
    """The parts of a ``__reduce_ex__`` value: state, arguments, list and dict items."""
    parts = _state_parts(reduced[2] if len(reduced) > 2 else None)
    args = reduced[1] if len(reduced) > 1 else ()
    parts += [
        (f".__reduce__()[1][{i}]", value)
        for i, value in enumerate(args or ())
        if not isinstance(value, type)  # copyreg.__newobj__'s class argument
    ]
    for items in reduced[3:5]:
        if items is not None:
            parts += [(f".items[{i}]", value) for i, value in enumerate(items)]
    return parts


def _state_parts(state: Any) -> list[tuple[str, Any]]:
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
        state = {**(state[0] or {}), **state[1]}  # (__dict__, __slots__ values)
    if isinstance(state, dict):
        return [((f".{k}" if isinstance(k, str) else f"[{k!r}]"), v) for k, v in state.items()]
    return [] if state is None else [(".__getstate__()", state)]


def locate(obj: Any, path: str, main_unimportable: bool) -> tuple[str, Any, BaseException]:
    """The innermost part of ``obj`` that fails: ``(path, part, why)``."""
    why = _problem(obj, main_unimportable)
    assert why is not None
    budget = _WALK_LIMIT
    while True:
        for suffix, part in _parts(obj):
            budget -= 1
            if budget < 0:
                return path, obj, why
            part_why = _problem(part, main_unimportable)
            if part_why is not None:
                obj, path, why = part, path + suffix, part_why
                break
        else:
            return path, obj, why


def _what(obj: Any) -> str:
    if isinstance(obj, type | types.FunctionType):
        return f"{obj.__module__}.{obj.__qualname__}"
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _fix(obj: Any, why: BaseException) -> str:
    if isinstance(why, _Unimportable):
        return (
            "it is defined in __main__, which has no file here (a notebook, `python -`, "
            "`python -c`), so a new worker process cannot import it. Define it in a module "
            "(a .py file) and import it from there"
        )
    if isinstance(obj, types.FunctionType) and "<locals>" in obj.__qualname__:
        return (
            "a lambda, or a function defined inside another, cannot be pickled. Define it at "
            "the top level of a module"
        )
    return (
        "open such a resource in each worker instead (in worker_init_fn, or on first use "
        "in __getitem__), or leave it out of the pickled state with __getstate__"
    )


def check_picklable(sent: Mapping[str, Any], method: str) -> None:
    """Raises when workers started with ``method`` could not receive one of ``sent``.

    Args:
        sent: By the loader argument's name: what every worker receives.
        method: The start method (``"spawn"``, ``"forkserver"``): named in the message.

    Raises:
        TypeError: Names the argument, the attribute path and type of the part that fails,
            why, and the fix.
    """
    main_unimportable = _main_has_no_file()
    for name, obj in sent.items():
        if obj is None or _problem(obj, main_unimportable) is None:
            continue
        path, part, why = locate(obj, name, main_unimportable)
        reason = "" if isinstance(why, _Unimportable) else f" ({type(why).__name__}: {why})"
        fork = ', or start them with mp_context="fork"' if sys.platform == "linux" else ""
        raise TypeError(
            f"asyncloader: the workers start with {method!r}, which pickles what they run, "
            f"and {path}: {_what(part)} cannot be sent to them{reason}: "
            f"{_fix(part, why)}{fork}."
        )
