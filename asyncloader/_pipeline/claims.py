"""One epoch at a time pulls an iterable dataset that is its own iterator.

An ``IterableDataset`` whose ``__iter__`` resets it and returns ``self`` has one position,
shared by every epoch that iterates it. asyncloader pulls a source ahead of its consumer, so
an epoch left unfinished (an iterator dropped mid-epoch, a second loader on the same object)
could go on pulling while a new epoch restarts and restores the object: samples would be
lost, silently. Instead the newest epoch claims the object when it calls ``iter()``; an
older epoch's next pull fails with an error that says why, and a pull in progress finishes
before the new epoch touches the object.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from asyncloader.errors import AsyncLoaderError


class Claim:
    """Who may pull one dataset object: ``owner``, under ``lock`` (held through each pull of a
    sync source and through the new owner's ``iter()`` and restore).

    Liveness: ``lock`` is held for one pull (one batch's ``next()`` calls) or one
    ``iter()``, by a ``with`` that releases it on every exit, and nothing awaited or waited
    for is held under it; so a new epoch's ``iter()`` waits at most for the pull under way,
    and an older epoch's next pull fails at :meth:`check` instead of waiting."""

    __slots__ = ("lock", "owner")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: object = None

    def check(self, token: object) -> None:
        """Raises when another epoch has claimed the object since ``token`` did."""
        if self.owner is not token:
            raise AsyncLoaderError(
                "this iterable dataset is its own iterator (__iter__ returns self) and another "
                "epoch started iterating the same object, which restarted it: this epoch "
                "stopped pulling it. Finish or close an iterator before iterating the dataset "
                "again, or give each loader its own dataset object."
            )


_claims: dict[int, Claim] = {}
# Reentrant: the cyclic garbage collector may run at any allocation made under it (making
# the finalizer below, for one) and collect another dataset, whose finalizer takes it again
# on this thread. A plain Lock deadlocked there.
_claims_lock = threading.RLock()


def claim_for(dataset: Any) -> Claim:
    """The claim of ``dataset`` (made on first use; forgotten when the dataset is collected)."""
    key = id(dataset)
    with _claims_lock:
        claim = _claims.get(key)
        if claim is None:
            claim = _claims[key] = Claim()
            # Not weak-referenceable: kept for the process's life.
            with contextlib.suppress(TypeError):
                weakref.finalize(dataset, _forget, key)
        return claim


def _forget(key: int) -> None:
    with _claims_lock:
        _claims.pop(key, None)
