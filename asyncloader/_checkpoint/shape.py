"""The shape of a saved state: each field's presence, type and range, checked before any of it
is used (:func:`asyncloader._checkpoint.checks.check_state` then checks it against the loader).

A state is plain data: dicts, lists, ints, bools, strs and ``None`` (the RNG state is a base64
string), so JSON and ``torch.load(weights_only=True)`` keep it. A source's own states
(``dataset_state``, ``dataset_iter_state``) are the source's to judge: only their place is
checked here. Every refusal is a ``ValueError`` naming the field by its path, as
``'_snapshot._worker_snapshots.worker_1.delivered'`` or ``'distributed.history[0]'``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from asyncloader._config import TAILS

#: 3 added ``"distributed"`` (the loader's own rank sampler: world, seed, length, remainder;
#: for an iterable source, the world size only: it keeps its position itself);
#: 4 moved ``source_state`` to StatefulDataLoader's places (:mod:`asyncloader._checkpoint.layout`);
#: 5 added ``dataset_len`` (a map-style dataset's ``len()``, ``None`` when unknown).
STATE_VERSION = 5
READABLE = (2, 3, 4, 5)

#: Positions, counts and epochs are torch's int64.
INT_LIMIT = 2**63
RNG_KINDS = ("generator", "global", "next_global")
#: The loader's own rank sampler's part of ``"distributed"``: all of them, or none.
ORDER_KEYS = ("tail", "dataset_len", "seed", "shuffle", "history")


def refuse(path: str, what: str) -> ValueError:
    """The error for field ``path`` of a state: ``state field 'path' <what>``."""
    return ValueError(f"state field {path!r} {what}")


def _need(parent: dict[str, Any], key: str, path: str) -> Any:
    if key not in parent:
        raise refuse(path, "is missing: the state is not one state_dict() returned")
    return parent[key]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, path: str, minimum: int = 0, optional: bool = False) -> int | None:
    """``value``, an int in ``[minimum, 2**63)`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return None
    if not _is_int(value) or not minimum <= value < INT_LIMIT:
        kind = f"an int in [{minimum}, 2**63)" + (" or None" if optional else "")
        raise refuse(path, f"must be {kind}, got {value!r:.60}")
    return int(value)


def _check_dict(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refuse(path, f"must be a dict, got {type(value).__qualname__}")
    return value


def _check_bool(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        raise refuse(path, f"must be True or False, got {value!r:.60}")


def _check_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise refuse(path, f"must be a list, got {type(value).__qualname__}")
    return list(value)


def check_shape(state: dict[str, Any]) -> None:
    """Checks every field of ``state`` that asyncloader reads, for any readable version.

    Raises:
        ValueError: A field is missing, of the wrong type or out of range; or the version
            is not one this asyncloader reads.
    """
    version = _need(state, "version", "version")
    if not _is_int(version) or version not in READABLE:
        raise refuse(
            "version", f"is {version!r:.40}, not one of {READABLE}: not saved by this asyncloader"
        )
    check_int(_need(state, "batch_size", "batch_size"), "batch_size", 1, optional=True)
    check_int(_need(state, "num_replicas", "num_replicas"), "num_replicas", 1, optional=True)
    check_int(_need(state, "epoch", "epoch"), "epoch")
    check_int(_need(state, "next_batch", "next_batch"), "next_batch")
    beyond = _check_list(_need(state, "delivered_beyond", "delivered_beyond"), "delivered_beyond")
    for i, seq in enumerate(beyond):
        check_int(seq, f"delivered_beyond[{i}]")
    if len(set(beyond)) != len(beyond):
        raise refuse("delivered_beyond", "names a batch twice")
    _check_rng(_need(state, "rng", "rng"))
    if version >= 5:
        check_int(_need(state, "dataset_len", "dataset_len"), "dataset_len", optional=True)
    if version >= 3 and "distributed" in state:
        _check_distributed(state["distributed"])
    if version >= 4:
        _check_layout(state)
    else:
        _check_own_form(_need(state, "source_state", "source_state"), "source_state")


def _check_rng(rng: Any) -> None:
    _check_dict(rng, "rng")
    kind = _need(rng, "kind", "rng.kind")
    if kind not in RNG_KINDS:
        raise refuse("rng.kind", f"must be one of {RNG_KINDS}, got {kind!r:.40}")
    encoded = _need(rng, "state", "rng.state")
    if not isinstance(encoded, str) or not encoded:
        raise refuse("rng.state", "must be a base64 string")
    try:
        base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise refuse("rng.state", "is not valid base64") from None


def decode_rng_bytes(encoded: str) -> bytes:
    """The bytes of a checked ``rng.state``."""
    return base64.b64decode(encoded, validate=True)


def _check_distributed(block: Any) -> None:
    _check_dict(block, "distributed")
    check_int(_need(block, "world_size", "distributed.world_size"), "distributed.world_size", 1)
    present = [key for key in ORDER_KEYS if key in block]
    if not present:
        return  # an iterable source's: the world size only
    for key in ORDER_KEYS:
        _need(block, key, f"distributed.{key}")
    _check_tail(block["tail"], "distributed.tail")
    check_int(block["dataset_len"], "distributed.dataset_len")
    seed = block["seed"]
    if not _is_int(seed) or not -INT_LIMIT <= seed < 2 * INT_LIMIT:
        raise refuse("distributed.seed", f"must be an int seed, got {seed!r:.40}")
    _check_bool(block["shuffle"], "distributed.shuffle")
    for i, cut in enumerate(_check_list(block["history"], "distributed.history")):
        path = f"distributed.history[{i}]"
        cut = _check_list(cut, path)
        if len(cut) != 3:
            raise refuse(path, "must be [world_size, taken, tail]")
        check_int(cut[0], f"{path}[0]", 1)
        check_int(cut[1], f"{path}[1]")
        _check_tail(cut[2], f"{path}[2]")


def _check_tail(tail: Any, path: str) -> None:
    if tail not in TAILS:
        raise refuse(path, f"must be one of {TAILS}, got {tail!r:.40}")


def _check_layout(state: dict[str, Any]) -> None:
    """Version 4 on: ``dataset_state`` and ``fetcher_state`` (read in this process), or
    ``_snapshot`` alone (workers iterating their own copies), or all three."""
    single = "dataset_state" in state or "fetcher_state" in state
    if single:
        _need(state, "dataset_state", "dataset_state")
        fetcher = _need(state, "fetcher_state", "fetcher_state")
        if fetcher is not None:
            _need(
                _check_dict(fetcher, "fetcher_state"),
                "dataset_iter_state",
                "fetcher_state.dataset_iter_state",
            )
    elif "_snapshot" not in state:
        raise refuse(
            "dataset_state",
            "is missing, and so is '_snapshot': the state has no place for the source's state",
        )
    if "_snapshot" in state:
        _check_snapshot(state["_snapshot"])


def _check_snapshot(snapshot: Any) -> None:
    """StatefulDataLoader's per-worker layout: ``worker_0`` .. ``worker_<n-1>``, either all
    empty (the workers iterate nothing of their own) or all full (``fetch_in_workers``)."""
    _check_dict(snapshot, "_snapshot")
    root = "_snapshot._worker_snapshots"
    workers = _check_dict(_need(snapshot, "_worker_snapshots", root), root)
    names = [f"worker_{i}" for i in range(len(workers))]
    if not workers or sorted(workers) != sorted(names):
        raise refuse(root, f"must hold worker_0 .. worker_<n-1>, got {sorted(workers)!r:.80}")
    check_int(_need(snapshot, "next_worker", "_snapshot.next_worker"), "_snapshot.next_worker")
    if snapshot["next_worker"] >= len(workers):
        raise refuse("_snapshot.next_worker", f"must be below the {len(workers)} of {root!r}")
    forms = {_check_worker(workers[name], f"{root}.{name}", i) for i, name in enumerate(names)}
    if len(forms) > 1:
        raise refuse(root, "mixes workers that iterate the source with workers that do not")


def _check_worker(entry: Any, path: str, index: int) -> bool:
    """One worker's snapshot; True when it iterates the source (``fetch_in_workers``)."""
    _check_dict(entry, path)
    if _need(entry, "worker_id", f"{path}.worker_id") != index or not _is_int(entry["worker_id"]):
        raise refuse(f"{path}.worker_id", f"must be {index}, got {entry['worker_id']!r:.40}")
    dataset = _need(entry, "dataset_state", f"{path}.dataset_state")
    fetcher = _need(entry, "fetcher_state", f"{path}.fetcher_state")
    if fetcher is None:
        if dataset is not None or "delivered" in entry:
            raise refuse(f"{path}.fetcher_state", "is None in a worker that iterated the source")
        return False
    _check_dict(fetcher, f"{path}.fetcher_state")
    _need(fetcher, "dataset_iter_state", f"{path}.fetcher_state.dataset_iter_state")
    ended = _need(fetcher, "fetcher_ended", f"{path}.fetcher_state.fetcher_ended")
    _check_bool(ended, f"{path}.fetcher_state.fetcher_ended")
    check_int(_need(entry, "delivered", f"{path}.delivered"), f"{path}.delivered")
    return True


def _check_own_form(value: Any, path: str) -> None:
    """Versions 2 and 3: ``source_state`` in asyncloader's own form."""
    if value is None:
        return
    _check_dict(value, path)
    if "per_worker" not in value and "next" not in value:  # one iteration's
        if "dataset" not in value or "iterator" not in value:
            raise refuse(path, "must hold 'dataset' and 'iterator', or 'per_worker' and 'next'")
        return
    workers = _check_list(_need(value, "per_worker", f"{path}.per_worker"), f"{path}.per_worker")
    if not workers:
        raise refuse(f"{path}.per_worker", "must name at least one worker")
    check_int(_need(value, "next", f"{path}.next"), f"{path}.next")
    if value["next"] >= len(workers):
        raise refuse(f"{path}.next", f"must be below the {len(workers)} of '{path}.per_worker'")
    for i, worker in enumerate(workers):
        at = f"{path}.per_worker[{i}]"
        _check_dict(worker, at)
        check_int(_need(worker, "delivered", f"{at}.delivered"), f"{at}.delivered")
        _check_bool(_need(worker, "ended", f"{at}.ended"), f"{at}.ended")
        own = _need(worker, "state", f"{at}.state")
        if own is not None:
            _need(_check_dict(own, f"{at}.state"), "dataset", f"{at}.state.dataset")
            _need(own, "iterator", f"{at}.state.iterator")
