"""Checkpoints: the state format (what the consumer has seen, versioned; its shape and its fit
to the loader checked before any of it is used), where a source's own state sits in it
(StatefulDataLoader's layout), and the progress record of a running epoch that
``state_dict()`` reads.

Imports: :mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and
its own modules. Nothing inside a worker process imports it.
"""

from __future__ import annotations

from asyncloader._checkpoint.checks import check_state
from asyncloader._checkpoint.layout import placed
from asyncloader._checkpoint.progress import Progress
from asyncloader._checkpoint.rebasing import rebase
from asyncloader._checkpoint.record import (
    Resume,
    dataset_len,
    decode_rng,
    encode_rng,
    fingerprint,
    fresh_state,
    next_epoch_state,
    ranks_state,
    resume_point,
    warn_replayed,
)
from asyncloader._checkpoint.shape import STATE_VERSION

__all__ = [
    "STATE_VERSION",
    "Progress",
    "Resume",
    "check_state",
    "dataset_len",
    "decode_rng",
    "encode_rng",
    "fingerprint",
    "fresh_state",
    "next_epoch_state",
    "placed",
    "ranks_state",
    "rebase",
    "resume_point",
    "warn_replayed",
]
