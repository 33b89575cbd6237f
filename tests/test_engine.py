"""The engine seam: the Transformer drives any Engine, and reports its crashes alike."""

import asyncio
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import pytest

from asyncloader._pipeline.transform import Transformer
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
