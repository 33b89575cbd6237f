"""How the Ray engine's requests travel, without a Ray cluster: pushes and a poll per actor
(:class:`~asyncloader._engines.ray.long_poll.LongPoll` over fake actor handles), and an actor's
inbox (:class:`~asyncloader._engines.ray.actor.Inbox`). The engine on a real local cluster:
tests/stress/engines/ray/test_ray.py, with a smoke test in tests/system/engines/ray/."""

from __future__ import annotations

import asyncio
import collections
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from asyncloader._engines.ray.actor import Inbox  # noqa: E402
from asyncloader._engines.ray.long_poll import LongPoll  # noqa: E402
from asyncloader._worker.protocol import RunBatch  # noqa: E402
from tests.helpers import CodedError  # noqa: E402
from tests.unit.engines.test_engine import CancelledAfterCheck  # noqa: E402

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


@pytest.mark.asyncio
async def test_a_flush_due_when_the_engine_stops_sends_nothing():
    """Requests of a turn whose flush runs after stop(): cancelled, and no call is made."""
    workers, actors = fake_workers()
    futures = submit(workers, range(2))
    workers.stop()
    await turn_ended()
    assert actors[0].calls == actors[1].calls == []
    assert all(f.cancelled() for f in futures)
