"""Where a source's own state sits in a saved state: the places StatefulDataLoader gives it.

Inside asyncloader a source's own state is one value
(:func:`asyncloader._base.source_state.source_state`:
``{"dataset", "iterator"}``; for workers iterating their own copies, the merge state of
:mod:`asyncloader._pipeline.worker_streams`: ``{"per_worker": [...], "next"}``). A saved state
(version 4)
puts it where torchdata's ``StatefulDataLoader`` does, so that code reading a dataset's state
out of a checkpoint works with either loader::

    read in this process      "dataset_state": D,
                              "fetcher_state": {"dataset_iter_state": I}  (None: map-style)
    num_workers > 0           "_snapshot": {"next_worker": turn, "_worker_snapshots": {
                                  "worker_<i>": {"worker_id": i, "delivered": batches,
                                                 "dataset_state": D_i,
                                                 "fetcher_state": {"dataset_iter_state": I_i,
                                                                   "fetcher_ended": bool}}}}

A worker that iterates nothing of its own (a map-style source, or an iterable read in this
process) has ``dataset_state`` and ``fetcher_state`` ``None``. The rest of a state dict
(position, RNG, fingerprint) is asyncloader's own.
"""

from __future__ import annotations

from typing import Any

from asyncloader._config import Options

#: The keys that hold a source's own state, in any readable version.
SOURCE_KEYS = ("source_state", "dataset_state", "fetcher_state", "_snapshot")


def placed(source_state: Any, options: Options) -> dict[str, Any]:
    """The keys that hold ``source_state`` (asyncloader's form) in a saved state."""
    out: dict[str, Any] = {}
    if not options.worker_streams:
        single = source_state or {}
        out["dataset_state"] = single.get("dataset")
        out["fetcher_state"] = (
            None if options.kind.is_map else {"dataset_iter_state": single.get("iterator")}
        )
    if options.num_workers:
        merge = source_state if options.worker_streams else None
        out["_snapshot"] = _snapshot(merge, options.num_workers)
    return out


def _snapshot(merge: dict[str, Any] | None, num_workers: int) -> dict[str, Any]:
    workers = {}
    for i in range(num_workers):
        entry: dict[str, Any] = {"worker_id": i, "dataset_state": None, "fetcher_state": None}
        if merge is not None:
            record = merge["per_worker"][i]
            own = record["state"] or {}
            entry["delivered"] = record["delivered"]
            entry["dataset_state"] = own.get("dataset")
            entry["fetcher_state"] = {
                "dataset_iter_state": own.get("iterator"),
                "fetcher_ended": record["ended"],
            }
        workers[f"worker_{i}"] = entry
    return {"next_worker": merge["next"] if merge is not None else 0, "_worker_snapshots": workers}


def taken(state: dict[str, Any]) -> Any:
    """The source's own state in asyncloader's form, from a saved state of any readable
    version (2 and 3 kept it as ``source_state``); ``None`` when it holds none."""
    if "source_state" in state:
        return state["source_state"]
    if "dataset_state" in state:
        fetcher = state.get("fetcher_state") or {}
        return _own(state["dataset_state"], fetcher.get("dataset_iter_state"))
    snapshot = state.get("_snapshot")
    if snapshot is None:
        return None
    workers = snapshot["_worker_snapshots"]
    per_worker = []
    for i in range(len(workers)):
        worker = workers[f"worker_{i}"]
        fetcher = worker["fetcher_state"] or {}
        per_worker.append(
            {
                "delivered": worker.get("delivered", 0),
                "ended": fetcher.get("fetcher_ended", False),
                "state": _own(worker["dataset_state"], fetcher.get("dataset_iter_state")),
            }
        )
    return {"per_worker": per_worker, "next": snapshot["next_worker"]}


def _own(dataset: Any, iterator: Any) -> dict[str, Any] | None:
    if dataset is None and iterator is None:
        return None
    return {"dataset": dataset, "iterator": iterator}
