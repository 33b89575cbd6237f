"""RayEngine (issue 16, item 3): the worker pipeline in Ray actors, with the same contracts.

One local Ray cluster (``ray.init(num_cpus=2)``) serves this module and is shut down after it,
so that later modules start in a process without Ray's threads. Each loader here starts its
own two actors (about a second each on 2 cores); the contract checkers run over the kinds of
source whose code paths differ (sync and async map-style, HTTP with a client per actor, sync
and async iterables, sharded tar streams).
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import warnings
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from asyncloader import AsyncLoader  # noqa: E402
from asyncloader._plan import BatchPlan  # noqa: E402
from asyncloader.errors import WorkerCrashedError  # noqa: E402
from asyncloader.ray import MAX_PER_CALL, RayEngine, RayWorkers, per_call  # noqa: E402
from tests.helpers import (  # noqa: E402
    AsyncSource,
    CodedError,
    DieAt,
    FailingSource,
    SyncSource,
    indices_of,
)
from tests.helpers.contracts import (  # noqa: E402
    check_exactly_once,
    check_order,
    check_resume,
    epoch,
    steps,
)
from tests.test_contracts import (  # noqa: E402, F401  (fixtures used by the kinds)
    KINDS,
    WORKER_RESUME_POINTS,
    contract_files,
    contract_http,
    expected,
    key_of,
    loader,
)
from tests.test_contracts import sources as sources  # noqa: E402  (a fixture)

pytestmark = pytest.mark.timeout(240)

RAY_KINDS = [
    k
    for k in KINDS
    if k.name in ("sync-map", "async-map", "http", "sync-iterable", "async-iterable", "sharded-tar")
]
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


@by_ray_kind
def test_order_on_ray(kind, sources):
    batches = epoch(loader(kind, sources, engine=RayEngine(2)), key_of(kind))
    check_order(batches, expected(kind, sources, AS_IN_WORKERS))
    assert all_cpus_free(), "the epoch's actors were not released"


RESUME_KINDS = [k for k in RAY_KINDS if k.name in ("sync-map", "async-iterable", "sharded-tar")]


@pytest.mark.parametrize("kind", RESUME_KINDS, ids=[k.name for k in RESUME_KINDS])
def test_resume_on_ray(kind, sources):
    """Stopped mid-epoch on one pair of actors, resumed on another: the same batches follow."""
    check_resume(
        lambda: loader(kind, sources, engine=RayEngine(2)), WORKER_RESUME_POINTS, key=key_of(kind)
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


def test_a_dead_actor_raises_worker_crashed_error_naming_it():
    with tempfile.TemporaryDirectory() as folder:
        die = DieAt(9, "exit", str(Path(folder) / "died"))
        made = AsyncLoader(SyncSource(40), batch_size=4, transform=die, engine=RayEngine(2))
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
    assert AsyncLoader(SyncSource(4), engine=RayEngine(3)).num_workers == 3


# -- how requests travel to the actors: several in one call ------------------------------------


class FakeActor:
    """An actor handle whose ``run`` calls the test answers itself: ``calls`` holds each
    call's requests and the future that answers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, Future]] = []
        self.run = SimpleNamespace(remote=self._run)

    def _run(self, requests: list) -> SimpleNamespace:
        answer: Future = Future()
        self.calls.append((requests, answer))
        return SimpleNamespace(future=lambda: answer)

    def sizes(self) -> list[int]:
        return [len(requests) for requests, _ in self.calls]

    def answer(self, call: int, *failures: int) -> None:
        """Answers call ``call``: each request's result is its batch number, except those at
        the positions in ``failures``, which raise CodedError."""
        requests, answer = self.calls[call]
        answer.set_result(
            [(False, CodedError("bad", code=i)) if i in failures else (True, args[0])
             for i, (_, args) in enumerate(requests)]
        )  # fmt: skip


def fake_workers() -> tuple[RayWorkers, list[FakeActor]]:
    engine = RayEngine(2)
    options = AsyncLoader(SyncSource(8), engine=engine)._options
    workers = RayWorkers(engine, options, BatchPlan.of(options), 0)
    workers._actors = actors = [FakeActor(), FakeActor()]
    return workers, actors


async def turn_ended() -> None:
    """Returns once the callbacks the loop already holds have run (callbacks run in order)."""
    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(done.set)
    await done.wait()


def submit(workers: RayWorkers, seqs) -> list[Future]:
    return [workers.submit(seq, [seq], None, None) for seq in seqs]


def test_per_call_is_half_what_an_actor_holds_up_to_a_cap():
    assert [per_call(n) for n in (0, 1, 2, 3, 5, 16)] == [1, 1, 1, 1, 2, 8]
    assert per_call(1000) == MAX_PER_CALL


@pytest.mark.asyncio
async def test_requests_of_one_loop_turn_leave_together_in_calls_of_half_the_load():
    workers, actors = fake_workers()
    futures = submit(workers, range(32))
    assert actors[0].calls == [] and actors[1].calls == [], "sent before the turn ended"
    await turn_ended()
    assert actors[0].sizes() == actors[1].sizes() == [8, 8]
    sent = sorted(args[0] for a in actors for requests, _ in a.calls for _, args in requests)
    assert sent == list(range(32)), "every batch asked for once"
    actors[0].answer(0)
    answered = [f.result(0) for f in futures if f.done()]
    assert sorted(answered) == sorted(args[0] for _, args in actors[0].calls[0][0])


@pytest.mark.asyncio
async def test_a_short_rest_waits_while_the_actor_has_a_call_in_flight_and_leaves_after():
    workers, actors = fake_workers()
    first = submit(workers, range(32))
    await turn_ended()
    actors[0].answer(0)  # actor 0 now holds 8, actor 1 holds 16
    rest = submit(workers, range(32, 37))  # to actor 0, the least loaded
    await turn_ended()
    assert actors[0].sizes() == [8, 8], "5 of 13 held are fewer than a call's worth (6)"
    actors[0].answer(1)
    await turn_ended()
    assert actors[0].sizes() == [8, 8, 2, 2], "an answer sends what waited: by 2 of 5 held"
    actors[0].answer(2)
    await turn_ended()
    assert actors[0].sizes() == [8, 8, 2, 2, 1], "the last one once fewer than 2 are in flight"
    for call in (3, 4):
        actors[0].answer(call)
    assert [f.result(0) for f in rest] == [32, 33, 34, 35, 36]
    assert sum(f.done() for f in first) == 16


@pytest.mark.asyncio
async def test_a_request_that_raised_fails_alone_and_a_dead_actor_fails_all_it_held():
    workers, actors = fake_workers()
    futures = submit(workers, range(32))
    await turn_ended()
    actors[0].answer(0, 1)
    requests = actors[0].calls[0][0]
    outcomes = {args[0]: futures[args[0]] for _, args in requests}
    failed = requests[1][1][0]
    with pytest.raises(CodedError):
        outcomes.pop(failed).result(0)
    assert all(f.result(0) == seq for seq, f in outcomes.items())
    actors[1].calls[0][1].set_exception(ray.exceptions.RayActorError())
    lost = [args[0] for _, args in actors[1].calls[0][0]]
    for seq in lost:
        with pytest.raises(BrokenProcessPool):
            futures[seq].result(0)
    assert workers.broken
    with pytest.raises(BrokenProcessPool):
        workers.submit(99, [99], None, None)
    held = lost + [args[0] for _, args in actors[1].calls[1][0]]
    assert all(f"batch {seq}" in workers.describe_crash({}) for seq in held)


def test_a_loader_sends_its_batches_in_fewer_calls_than_batches(monkeypatch):
    calls = []
    call = RayWorkers._call
    monkeypatch.setattr(
        RayWorkers,
        "_call",
        lambda self, w, requests: calls.append(len(requests)) or call(self, w, requests),
    )
    made = AsyncLoader(AsyncSource(64), batch_size=2, io_concurrency=64, engine=RayEngine(2))
    assert indices_of(made) == list(range(64))
    assert sum(calls) == 32 and len(calls) <= 16, f"calls of {calls} requests"


def test_requests_left_by_a_loop_closed_before_its_flush_leave_with_the_next_loops():
    """An epoch's loop may close with a flush unrun (``async for`` under ``asyncio.run``,
    left mid-turn): the next epoch, on another loop, must not wait for that flush."""
    workers, actors = fake_workers()

    async def ask_and_stop() -> None:
        submit(workers, range(2))
        asyncio.get_running_loop().stop()  # this turn is the loop's last

    old = asyncio.new_event_loop()
    try:
        old.run_until_complete(ask_and_stop())
    finally:
        old.close()
    assert actors[0].calls == actors[1].calls == [], "the old loop ran its flush"

    async def ask_again() -> None:
        submit(workers, [2])
        await turn_ended()

    asyncio.run(ask_again())
    sent = sorted(args[0] for a in actors for requests, _ in a.calls for _, args in requests)
    assert sent == [0, 1, 2]
