"""RayEngine: the worker pipeline in Ray actors, with the same contracts.

One local Ray cluster (``ray.init(num_cpus=2)``) serves this module and is shut down after it,
so that later modules start in a process without Ray's threads. Each loader here starts its
own two actors (about a second each on 2 cores); the contract checkers run over the kinds of
source whose code paths differ (sync and async map-style, HTTP with a client per actor, sync
and async iterables, sharded tar streams).
"""

from __future__ import annotations

import collections
import functools
import tempfile
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from asyncloader import AsyncLoader  # noqa: E402
from asyncloader._engines.ray.long_poll import LongPoll  # noqa: E402
from asyncloader.errors import WorkerCrashedError  # noqa: E402
from asyncloader.ray import RayEngine  # noqa: E402
from tests.helpers import (  # noqa: E402
    AsyncSource,
    CodedError,
    DieAt,
    FailingSource,
    SyncSource,
    indices_of,
)
from tests.helpers.contract_matrix import (  # noqa: E402, F401  (fixtures used by the kinds)
    KINDS,
    WORKER_RESUME_POINTS,
    contract_files,
    contract_http,
    expected,
    key_of,
    loader,
)
from tests.helpers.contract_matrix import sources as sources  # noqa: E402  (a fixture)
from tests.helpers.contracts import (  # noqa: E402
    check_exactly_once,
    check_order,
    check_resume,
    epoch,
    steps,
)

pytestmark = pytest.mark.timeout(240)

RAY_NAMES = (
    "sync-map",
    "getitems-map",
    "async-map",
    "http",
    "sync-iterable",
    "async-iterable",
    "sharded-tar",
)
RAY_KINDS = [k for k in KINDS if k.name in RAY_NAMES]
#: What the order of a Ray loader's samples is computed as: 2 workers iterating their parts.
AS_IN_WORKERS = {"num_workers": 2, "fetch_in_workers": True}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """A local 2-CPU Ray cluster for this module (no dashboard), shut down after it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def by_ray_kind(fn):
    return pytest.mark.parametrize("kind", RAY_KINDS, ids=[k.name for k in RAY_KINDS])(fn)


#: How batches travel from actors on this machine: over Unix sockets (the default), or
#: through Ray's calls and object store (what actors on other nodes use).
by_transport = pytest.mark.parametrize("local_sockets", [True, False], ids=["sockets", "ray"])


@ray.remote
def _granted() -> bool:
    return True


def all_cpus_free(within_s: float = 30.0) -> bool:
    """Every CPU of the cluster is free again (the actors are gone) within ``within_s``: Ray's
    scheduler grants a task that needs all of them (it learns of an exit a moment after it)."""
    ref = _granted.options(num_cpus=ray.cluster_resources()["CPU"]).remote()
    try:
        return ray.get(ref, timeout=within_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        return False


def cpus_held() -> bool:
    """Some of the cluster's CPUs are held now (by live actors)."""
    return ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]


@by_transport
@by_ray_kind
def test_order_on_ray(kind, sources, local_sockets):
    engine = RayEngine(2, local_sockets=local_sockets)
    batches = epoch(loader(kind, sources, engine=engine), key_of(kind))
    check_order(batches, expected(kind, sources, AS_IN_WORKERS))
    assert all_cpus_free(), "the epoch's actors were not released"


RESUME_KINDS = [k for k in RAY_KINDS if k.name in ("sync-map", "async-iterable", "sharded-tar")]


@by_transport
@pytest.mark.parametrize("kind", RESUME_KINDS, ids=[k.name for k in RESUME_KINDS])
def test_resume_on_ray(kind, sources, local_sockets):
    """Stopped mid-epoch on one pair of actors, resumed on another: the same batches follow."""
    engine = functools.partial(RayEngine, 2, local_sockets=local_sockets)
    check_resume(
        lambda: loader(kind, sources, engine=engine()), WORKER_RESUME_POINTS, key=key_of(kind)
    )


def test_persistent_actors_serve_every_epoch_and_free_their_cpus_on_close():
    made = AsyncLoader(
        SyncSource(40), batch_size=4, shuffle=True, engine=RayEngine(2), persistent_workers=True
    )
    try:
        for _ in range(2):
            check_exactly_once([indices_of(made)], range(40))
            assert cpus_held(), "persistent actors hold their CPUs between epochs"
    finally:
        made.close()
    assert all_cpus_free()


def raise_on_seven(x):
    if int(x[0]) == 7:
        raise CodedError("bad sample", code=7)
    return x


def test_a_transform_error_in_an_actor_keeps_its_type_note_and_traceback():
    got, errors = steps(
        AsyncLoader(SyncSource(12), batch_size=4, transform=raise_on_seven, engine=RayEngine(2))
    )
    assert indices_of(got) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert len(errors) == 1 and errors[0].code == 7
    assert "stage=transform batch=1 index=7" in "\n".join(errors[0].__notes__)
    assert "raise_on_seven" in str(errors[0].__cause__), "the actor's traceback"


@by_transport
def test_a_dead_actor_raises_worker_crashed_error_naming_it(local_sockets):
    with tempfile.TemporaryDirectory() as folder:
        die = DieAt(9, "exit", str(Path(folder) / "died"))
        engine = RayEngine(2, local_sockets=local_sockets)
        made = AsyncLoader(SyncSource(40), batch_size=4, transform=die, engine=engine)
        with pytest.raises(WorkerCrashedError, match=r"Ray actor \d died while running .*batch 2"):
            indices_of(made)
    assert all_cpus_free()


def test_with_max_restarts_a_dead_actor_is_replaced_and_its_batches_come_once():
    """Ray restarts the actor and retries its unfinished batches: every sample once, in order."""
    with tempfile.TemporaryDirectory() as folder:
        die = DieAt(9, "exit", str(Path(folder) / "died"))
        engine = RayEngine(2, max_restarts=1, max_task_retries=2)
        made = AsyncLoader(SyncSource(40), batch_size=4, transform=die, engine=engine)
        assert indices_of(made) == list(range(40))
        assert (Path(folder) / "died").exists(), "no actor died: the test tested nothing"


@pytest.mark.parametrize("collate_fn", [np.stack, None], ids=["numpy", "tensors"])
@pytest.mark.parametrize("trimmed", [False, True], ids=["whole", "trimmed"])
def test_batches_are_writable_and_do_not_alias_the_object_store(collate_fn, trimmed):
    """Arrays, and tensors (sent as arrays, out of band), come back as copies of their own,
    also in a batch a skipped sample was left out of: torch warns when it wraps a read-only
    array of the object store, an error here. Batches of 192 KiB or more: smaller ones come
    inline, never in the store."""
    source = FailingSource(8, bad=3) if trimmed else SyncSource(8)
    made = AsyncLoader(
        source, batch_size=4, collate_fn=collate_fn, engine=RayEngine(2),
        persistent_workers=True, transform=functools.partial(np.resize, new_shape=8192),
        on_error="skip" if trimmed else "raise", max_skipped=1 if trimmed else None,
    )  # fmt: skip
    expected = [0, 1, 2] if trimmed else [0, 1, 2, 3]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first = next(iter(made))
        if collate_fn is None:
            assert isinstance(first, torch.Tensor)
            assert first[:, 0].tolist() == expected
        else:
            assert isinstance(first, np.ndarray) and first.flags.writeable
        first[:] = -1
        assert indices_of(made)[: len(expected)] == expected
    finally:
        made.close()


def test_engine_arguments_are_checked():
    with pytest.raises(ValueError, match="engine and executor are exclusive"):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            AsyncLoader(SyncSource(4), engine=RayEngine(2), executor=pool)
    with pytest.raises(ValueError, match="num_workers=3 and engine"):
        AsyncLoader(SyncSource(4), engine=RayEngine(2), num_workers=3)
    with pytest.raises(TypeError, match="engine must be a worker engine"):
        AsyncLoader(SyncSource(4), engine="ray")
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        RayEngine(0)
    with pytest.raises(TypeError, match="local_sockets must be a bool"):
        RayEngine(2, local_sockets="yes")
    assert AsyncLoader(SyncSource(4), engine=RayEngine(3)).num_workers == 3


def count_ray_calls(monkeypatch) -> list[int]:
    """The requests each Ray call to an actor carries, from now on."""
    carried: list[int] = []
    call = LongPoll._call
    monkeypatch.setattr(
        LongPoll,
        "_call",
        lambda self, w, poll, requests: (
            carried.append(len(requests)) or call(self, w, poll, requests)
        ),
    )
    return carried


def test_a_loader_sends_its_batches_in_fewer_calls_than_batches(monkeypatch):
    carried = count_ray_calls(monkeypatch)
    engine = RayEngine(2, local_sockets=False)
    made = AsyncLoader(AsyncSource(64), batch_size=2, io_concurrency=64, engine=engine)
    assert indices_of(made) == list(range(64))
    sending = [n for n in carried if n]
    assert sum(sending) == 32 and len(sending) <= 16, f"calls of {carried} requests"


def test_actors_on_this_machine_answer_over_sockets_not_through_ray(monkeypatch):
    carried = count_ray_calls(monkeypatch)
    made = AsyncLoader(AsyncSource(64), batch_size=2, io_concurrency=64, engine=RayEngine(2))
    assert indices_of(made) == list(range(64))
    assert carried == [], "batches went through Ray calls"
    assert not [t for t in threading.enumerate() if t.name == "asyncloader-receiver"]
    assert all_cpus_free()


def test_a_trace_names_the_actors_and_holds_their_work(tmp_path):
    """Actors on this machine record into the trace like worker processes, as "Ray actor N",
    on the machine's clock; the consumer's waits count per actor."""
    import json

    import asyncloader

    path = tmp_path / "ray.json"
    with asyncloader.trace(path):
        made = AsyncLoader(AsyncSource(64), batch_size=4, engine=RayEngine(2))
        assert indices_of(made) == list(range(64))
    trace = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert sorted(names.values()) == ["Ray actor 0", "Ray actor 1", "training process"]
    collated = [e for e in trace if e["ph"] == "X" and e["name"].startswith("collate ")]
    assert sorted(int(e["name"].split()[1]) for e in collated) == list(range(16))
    assert {e["pid"] for e in collated} <= {p for p, n in names.items() if n.startswith("Ray")}
    assert collections.Counter(e["id"] for e in trace if e["ph"] == "f") == collections.Counter(
        range(16)
    )
    assert sorted(made.stats.wait_by_worker) == [0, 1]


def test_actors_that_cannot_reach_the_socket_answer_through_ray(monkeypatch):
    """Actors on another node (here: a training process that says it is on one) answer
    through Ray's calls, every batch once."""
    carried = count_ray_calls(monkeypatch)
    elsewhere = SimpleNamespace(get_node_id=lambda: "another node")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: elsewhere)
    made = AsyncLoader(AsyncSource(64), batch_size=2, io_concurrency=64, engine=RayEngine(2))
    assert indices_of(made) == list(range(64))
    assert sum(carried) == 32
