"""RayEngine: the worker pipeline in Ray actors, with the same contracts.

One local Ray cluster (``ray.init(num_cpus=2)``) serves this module and is shut down after it,
so that later modules start in a process without Ray's threads. Each loader here starts its
own two actors (about a second each on 2 cores); the contract checkers run over the kinds of
source whose code paths differ (sync and async map-style, HTTP with a client per actor, sync
and async iterables, sharded tar streams).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import tempfile
import threading
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
from asyncloader._engines.ray.actor import Inbox  # noqa: E402
from asyncloader._engines.ray.long_poll import LongPoll  # noqa: E402
from asyncloader._worker.protocol import RunBatch  # noqa: E402
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
from tests.unit.engines.test_engine import CancelledAfterCheck  # noqa: E402

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


# -- how requests travel to the actors: pushes, and a poll per actor ---------------------------


class FakeActor:
    """An actor handle whose ``exchange`` calls the test answers itself: ``calls`` holds each
    call's requests, whether it polls, and the future that answers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, bool, Future]] = []
        self.exchange = SimpleNamespace(remote=self._exchange)
        self._arrived = threading.Condition()

    def _exchange(self, requests: list, wait: bool) -> SimpleNamespace:
        answer: Future = Future()
        with self._arrived:
            self.calls.append((requests, wait, answer))
            self._arrived.notify_all()
        return SimpleNamespace(future=lambda: answer)

    def wait_calls(self, n: int) -> bool:
        """Waits (10 s at most) until ``n`` calls came, from whichever thread sends them."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.calls) >= n, timeout=10)

    def kinds(self) -> list[tuple[str, int]]:
        """Each call as ("poll" or "push", how many requests it carried)."""
        return [("poll" if wait else "push", len(requests)) for requests, wait, _ in self.calls]

    def seqs(self, call: int) -> list[int]:
        """The batch numbers call ``call`` asked for."""
        return [request.seq for _, request in self.calls[call][0]]

    def answer(self, call: int, seqs, failures=(), incarnation: str = "first") -> None:
        """Answers call ``call`` with the batches ``seqs`` (each request it holds answers its
        batch number), those in ``failures`` raising CodedError."""
        numbers = {r.seq: number for requests, _, _ in self.calls for number, r in requests}
        self.calls[call][2].set_result((
            incarnation,
            [(numbers[s], False, CodedError("bad", code=s)) if s in failures
             else (numbers[s], True, s) for s in seqs],
        ))  # fmt: skip


def fake_workers() -> tuple[LongPoll, list[FakeActor]]:
    actors = [FakeActor(), FakeActor()]
    return LongPoll(actors, [{"first"}, {"first"}]), actors  # as start() makes it


async def turn_ended() -> None:
    """Returns once the callbacks the loop already holds have run (callbacks run in order)."""
    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(done.set)
    await done.wait()


def submit(workers: LongPoll, seqs) -> list[Future]:
    return [workers.submit(seq, [seq], None, None) for seq in seqs]


def sent(actors) -> list[int]:
    return sorted(s for a in actors for call in range(len(a.calls)) for s in a.seqs(call))


@pytest.mark.asyncio
async def test_requests_of_one_loop_turn_leave_together_with_each_actors_poll():
    workers, actors = fake_workers()
    submit(workers, range(32))
    assert actors[0].calls == [] and actors[1].calls == [], "sent before the turn ended"
    await turn_ended()
    assert actors[0].kinds() == actors[1].kinds() == [("poll", 16)]
    assert sent(actors) == list(range(32)), "every batch asked for once"


@pytest.mark.asyncio
async def test_a_poll_brings_what_is_ready_and_goes_again_while_the_actor_holds_work():
    workers, actors = fake_workers()
    futures = submit(workers, range(32))
    await turn_ended()
    ready = actors[0].seqs(0)[:3]
    actors[0].answer(0, ready)
    assert [futures[s].result(0) for s in ready] == ready
    assert sum(f.done() for f in futures) == 3
    await turn_ended()
    assert actors[0].kinds() == [("poll", 16), ("poll", 0)], "the next poll, at once"
    actors[0].answer(1, actors[0].seqs(0)[3:])
    await turn_ended()
    assert actors[0].kinds() == [("poll", 16), ("poll", 0)], "no poll once it holds nothing"
    assert actors[1].kinds() == [("poll", 16)]


@pytest.mark.asyncio
async def test_requests_made_while_a_poll_is_out_wait_for_it_while_the_actor_has_work():
    workers, actors = fake_workers()
    submit(workers, range(8))
    await turn_ended()
    waiting = submit(workers, [8, 9])  # one each: 4 of 5 held are sent
    await turn_ended()
    assert actors[0].kinds() == actors[1].kinds() == [("poll", 4)], "no push: not short"
    actors[0].answer(0, actors[0].seqs(0)[:1])
    await turn_ended()
    assert actors[0].kinds() == [("poll", 4), ("poll", 1)], "the next poll carries it"
    assert actors[1].kinds() == [("poll", 4)]
    assert sent(actors) == list(range(9)) and not waiting[0].done()


@pytest.mark.asyncio
async def test_an_actor_short_of_work_gets_a_push_and_one_push_at_a_time():
    workers, actors = fake_workers()
    first = submit(workers, range(2))
    await turn_ended()
    submit(workers, range(2, 6))  # two each: 1 of 3 held is sent
    await turn_ended()
    assert actors[0].kinds() == actors[1].kinds() == [("poll", 1), ("push", 2)]
    later = submit(workers, range(6, 14))  # four each: 3 of 7 sent, but a push is in flight
    await turn_ended()
    assert actors[0].kinds() == [("poll", 1), ("push", 2)]
    done = actors[0].seqs(0)
    actors[0].answer(1, done)  # the push's answer brings what was ready then
    assert first[done[0]].result(0) == done[0]
    await turn_ended()
    assert actors[0].kinds() == [("poll", 1), ("push", 2), ("push", 4)]
    assert len(sent(actors)) == 10 and set(actors[0].seqs(2)) < set(range(6, 14))
    assert not any(f.done() for f in later)


@pytest.mark.asyncio
async def test_a_request_that_raised_fails_alone_and_a_dead_actor_fails_all_it_held():
    workers, actors = fake_workers()
    futures = submit(workers, range(8))
    await turn_ended()
    seqs = actors[0].seqs(0)
    actors[0].answer(0, seqs, failures=seqs[1:2])
    with pytest.raises(CodedError):
        futures[seqs[1]].result(0)
    assert all(futures[s].result(0) == s for s in seqs if s != seqs[1])
    more = submit(workers, [8, 9])  # to actor 0, which holds nothing now
    await turn_ended()
    actors[1].calls[0][2].set_exception(ray.exceptions.RayActorError())
    lost = actors[1].seqs(0)
    for seq in lost:
        with pytest.raises(BrokenProcessPool):
            futures[seq].result(0)
    assert workers.broken
    with pytest.raises(BrokenProcessPool):
        workers.submit(99, [99], None, None)
    assert all(f"batch {seq}" in workers.describe_crash({}) for seq in lost)
    assert not any(f.done() for f in more), "actor 0's requests are not actor 1's"


@pytest.mark.asyncio
async def test_an_answer_to_a_request_cancelled_meanwhile_does_not_lose_the_others():
    """A call's answers settle every request they answer, also when one was cancelled by its
    waiter between the check and the set (its InvalidStateError used to end the callback, and
    the requests after it in the call waited for ever)."""
    workers, actors = fake_workers()
    futures = submit(workers, range(8))
    await turn_ended()
    seqs = actors[0].seqs(0)
    first = next(r for _, r in workers._held.values() if r.request.seq == seqs[0])
    first.out = CancelledAfterCheck()
    actors[0].answer(0, seqs)
    assert first.out.cancelled()
    assert all(futures[s].result(0) == s for s in seqs[1:])
    actors[1].calls[0][2].set_exception(ray.exceptions.RayActorError())
    lost = actors[1].seqs(0)
    assert all(isinstance(futures[s].exception(0), BrokenProcessPool) for s in lost)


@pytest.mark.asyncio
async def test_a_restarted_actor_is_sent_what_it_held_again_and_each_answer_counts_once():
    """Ray restarted actor 0 and retried its poll: the new incarnation lost what earlier calls
    started, so the driver sends those again; an answer that comes twice settles once."""
    workers, actors = fake_workers()
    futures = submit(workers, range(2))
    await turn_ended()
    futures += submit(workers, range(2, 6))
    await turn_ended()
    assert actors[0].kinds() == [("poll", 1), ("push", 2)]
    polled, pushed = actors[0].seqs(0), actors[0].seqs(1)
    actors[0].answer(0, pushed[:1], incarnation="restarted")
    await turn_ended()
    assert actors[0].kinds()[2] == ("poll", 2), "held and unanswered: sent again"
    assert sorted(actors[0].seqs(2)) == sorted(polled + pushed[1:])
    actors[0].answer(2, polled + pushed[1:], incarnation="restarted")
    actors[0].answer(1, pushed, incarnation="first")  # the old push's answer, late
    assert {s: futures[s].result(0) for s in polled + pushed} == {s: s for s in polled + pushed}
    assert workers._load[0] == 0, "each request counted off once"
    assert not workers.broken


def test_requests_from_no_loop_leave_at_once_and_the_next_poll_goes_from_a_thread():
    workers, actors = fake_workers()
    futures = submit(workers, range(4))
    assert actors[0].kinds() == actors[1].kinds() == [("poll", 1)], "the rest is not short"
    actors[0].answer(0, [0])
    assert futures[0].result(0) == 0
    assert actors[0].wait_calls(2), "no poll after the answer"
    assert actors[0].kinds() == [("poll", 1), ("poll", 1)] and actors[0].seqs(1) == [2]


class GatedCore:
    """A worker core whose ``batch`` waits until the test opens ``gate``; ``runs`` counts
    the runs of each batch, ``tasks`` holds them."""

    def __init__(self) -> None:
        self.runs: collections.Counter = collections.Counter()
        self.tasks: list[asyncio.Task] = []
        self.gate = asyncio.Event()

    def spawn(self, coro, name: str) -> asyncio.Task:
        self.tasks.append(asyncio.get_running_loop().create_task(coro, name=name))
        return self.tasks[-1]

    def run(self, request: RunBatch):
        return self.batch(request.seq)

    async def batch(self, seq: int) -> int:
        self.runs[seq] += 1
        await self.gate.wait()
        if seq < 0:
            raise CodedError("bad", code=seq)
        return seq


@pytest.mark.asyncio
async def test_an_actors_inbox_runs_a_number_once_and_keeps_its_answer_until_collected():
    core = GatedCore()
    inbox = Inbox(core)
    inbox.start([(1, RunBatch(10, [10], None, None)), (2, RunBatch(-1, [-1], None, None))])
    inbox.start([(1, RunBatch(10, [10], None, None))])  # a retried call's: joins the one running
    assert await inbox.collect(False) == []
    waiting = asyncio.ensure_future(inbox.collect(True))
    await turn_ended()
    assert not waiting.done() and core.runs == {10: 1, -1: 1}
    core.gate.set()
    answers = await waiting
    await asyncio.wait(core.tasks)
    answers += await inbox.collect(False)
    assert sorted((n, ok) for n, ok, _ in answers) == [(1, True), (2, False)]
    assert dict((n, v) for n, _, v in answers)[1] == 10
    assert isinstance(dict((n, v) for n, _, v in answers)[2], CodedError)
    assert core.runs == {10: 1, -1: 1}, "each number ran once"
    assert await asyncio.wait_for(inbox.collect(True), 10) == [], "nothing runs: no wait"


@pytest.mark.asyncio
async def test_closing_an_inbox_wakes_its_waiting_collect():
    core = GatedCore()
    inbox = Inbox(core)
    inbox.start([(1, RunBatch(10, [10], None, None))])
    waiting = asyncio.ensure_future(inbox.collect(True))
    await turn_ended()
    assert not waiting.done()
    inbox.close()
    assert await asyncio.wait_for(waiting, 10) == []
    core.gate.set()
    await asyncio.wait(core.tasks)


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
    assert sent(actors) == [0, 1, 2]
