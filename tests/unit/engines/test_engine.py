"""The engine seam: the Transformer drives any Engine, and reports its crashes alike."""

import asyncio
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import pytest

from asyncloader._engines.channels import Channels
from asyncloader._pipeline.transform import Transformer
from asyncloader._worker.protocol import answer_bytes
from asyncloader.errors import WorkerCrashedError


class FakeEngine:
    """An engine whose batches are their indices, or that has lost its workers."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.submitted = []

    def start(self) -> None:
        pass

    def submit(self, seq, indices, samples, seeds):
        if self.broken:
            raise BrokenProcessPool("gone")
        self.submitted.append(seq)
        future: Future = Future()
        future.set_result(list(indices))
        return future

    def describe_crash(self, inflight):
        return f"worker 7 died holding {sorted(inflight)}"

    def shutdown(self) -> None:
        pass


@pytest.mark.asyncio
async def test_transformer_runs_batches_on_any_engine():
    """Batches go through the engine's submit, results come back unchanged."""
    engine = FakeEngine()
    transformer = Transformer(engine, window=2, seeds=None, inflight={})
    got = await asyncio.gather(*(transformer.run(seq, [seq, seq + 1], None) for seq in range(5)))
    assert got == [[seq, seq + 1] for seq in range(5)]
    assert sorted(engine.submitted) == list(range(5))


@pytest.mark.asyncio
async def test_a_broken_engine_is_a_worker_crash_with_its_description():
    """Whatever the engine, a lost worker raises WorkerCrashedError naming what it held."""
    transformer = Transformer(FakeEngine(broken=True), window=1, seeds=None, inflight={3: [9]})
    with pytest.raises(WorkerCrashedError, match=r"worker 7 died holding \[3\]"):
        await transformer.run(3, [9], None)


class CancelledAfterCheck(Future):
    """A request's future that its waiter cancels (from the loop's thread) after a receiver
    found it not done and before it sets it: the interleaving, made certain."""

    def set_result(self, result) -> None:
        self.cancel()
        super().set_result(result)

    def set_exception(self, exception) -> None:
        self.cancel()
        super().set_exception(exception)


class Answers:
    """A worker's connection holding the answers ``(key, result)`` to read, in order."""

    def __init__(self, *answers) -> None:
        self._answers = [bytes(answer_bytes(key, result)) for key, result in answers]

    def recv_bytes(self) -> bytes:
        return self._answers.pop(0)


def test_an_answer_to_a_request_cancelled_meanwhile_does_not_stop_the_receiver():
    """The receiver skips an answer whose request was cancelled between its check and its
    set, and goes on answering the others (else they would wait for ever)."""
    channels = Channels(1, "AsyncLoader")
    cancelled, waited = CancelledAfterCheck(), Future()
    channels._pending = {1: (0, cancelled, None), 2: (0, waited, None)}
    channels._load = [2]
    conn = Answers((1, "one"), (2, "two"))
    assert channels._take(0, conn) and channels._take(0, conn)
    assert cancelled.cancelled() and waited.result(0) == "two"
    channels._pending = {3: (0, CancelledAfterCheck(), None), 4: (0, waited := Future(), None)}
    channels._died(0)  # a death fails the rest alike
    with pytest.raises(BrokenProcessPool):
        waited.result(0)
