"""The stall dump: ``ASYNCLOADER_STALL_DUMP=<seconds>`` logs an epoch's state once per stall,
nothing while batches flow or when unset; ``diagnose.dump_state`` gives the same on demand."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np
import pytest

from asyncloader import AsyncLoader
from asyncloader._base.validate import STALL_DUMP_ENV
from asyncloader.diagnose import dump_state
from tests.helpers import sample
from tests.helpers.waiting import WAIT_S, wait_event

pytestmark = pytest.mark.timeout(60)

STALL_S = 0.2
N, BATCH = 256, 16
#: Every part of a dump (asyncloader._pipeline.stall_dump): stages, limits, tuner moves,
#: the loop's tasks and the threads.
SECTIONS = (
    "stages:", "fetch ", "engine ", "reorder ", "device ", "consumer ", "limits:", "io limit ",
    "window ", "prefetch ", "tuner moves", "tasks on ", "threads (",
)  # fmt: skip


class Gated:
    """An async source whose samples in ``stuck`` each wait for their own gate, an
    ``asyncio.Event`` of the loop that fetches them, until :meth:`release` opens it."""

    def __init__(self, n: int, stuck: tuple[int, ...]) -> None:
        self.n, self.stuck = n, stuck
        self.reached = {index: threading.Event() for index in stuck}
        self._gates: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        if index in self.reached:
            gate = asyncio.Event()
            self._gates[index] = (asyncio.get_running_loop(), gate)
            self.reached[index].set()
            await gate.wait()
        return sample(index)

    def release(self, index: int) -> None:
        """Opens the gate of sample ``index`` (from any thread), once it is waiting there."""
        wait_event(self.reached[index], f"sample {index} to be fetched")
        loop, gate = self._gates[index]
        loop.call_soon_threadsafe(gate.set)


class Dumps(logging.Handler):
    """The stall dumps logged, which any thread may wait for."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.texts: list[str] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.texts.append(record.getMessage())
            self._changed.notify_all()

    def reach(self, count: int, timeout_s: float = WAIT_S) -> bool:
        """Waits until ``count`` dumps were logged; False if not within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.texts) >= count, timeout_s)


@pytest.fixture
def dumps():
    logger = logging.getLogger("asyncloader._pipeline.stall_dump")
    handler = Dumps()
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _received(batches: list) -> list[int]:
    return [int(i) for batch in batches for i in batch[:, 0]]


def _in_background(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, name="test-releaser", daemon=True)
    thread.start()
    return thread


def test_each_stall_is_logged_once_with_every_section(monkeypatch, dumps):
    """Two stalls (a sample waits for its gate, the consumer for its batch): one dump each,
    with every section and the waiting sample's own frame; none between them."""
    monkeypatch.setenv(STALL_DUMP_ENV, str(STALL_S))
    source = Gated(N, stuck=(70, 200))
    loader = AsyncLoader(source, batch_size=BATCH)
    seen: list[bool] = []

    def release() -> None:
        try:
            seen.append(dumps.reach(1))
            # Four times the threshold, still stalled: nothing more is logged meanwhile.
            seen.append(not dumps.reach(2, 4 * STALL_S))
        finally:
            source.release(70)
        try:
            seen.append(dumps.reach(2))
        finally:
            source.release(200)

    releaser = _in_background(release)
    with loader:
        got = _received(list(loader))
    releaser.join()
    assert got == list(range(N))
    assert seen == [True, True, True]
    assert len(dumps.texts) == 2
    for text, index in zip(dumps.texts, (70, 200), strict=True):
        assert f"{STALL_DUMP_ENV}={STALL_S:g}" in text
        for section in SECTIONS:
            assert section in text, (section, text)
        assert f"batch {index // BATCH} (indices [{index // BATCH * BATCH}," in text, text
        assert "waiting for a batch" in text
        assert "in __getitem__" in text and "await gate.wait()" in text, text
        assert "MainThread" in text and "asyncloader-loop" in text, text


def test_an_async_for_epoch_logs_its_stall(monkeypatch, dumps):
    """An ``async for`` epoch, on the caller's loop, is watched as a ``for`` epoch is."""
    monkeypatch.setenv(STALL_DUMP_ENV, str(STALL_S))
    source = Gated(64, stuck=(5,))

    def release() -> None:
        try:
            dumps.reach(1)
        finally:
            source.release(5)

    async def epoch() -> list:
        async with AsyncLoader(source, batch_size=BATCH) as loader:
            return [batch async for batch in loader]

    releaser = _in_background(release)
    got = _received(asyncio.run(epoch()))
    releaser.join()
    assert got == list(range(64))
    assert len(dumps.texts) == 1
    assert "tasks on " in dumps.texts[0] and "await gate.wait()" in dumps.texts[0]


class Steady:
    """An async source whose every sample takes ``latency_s``."""

    def __init__(self, n: int, latency_s: float) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        await asyncio.sleep(self.latency_s)
        return sample(index)


def test_samples_that_keep_arriving_are_no_stall(monkeypatch, dumps):
    """The consumer waits for batches 4 x the threshold each, but a sample arrives every half
    threshold: nothing is logged."""
    monkeypatch.setenv(STALL_DUMP_ENV, str(STALL_S))
    loader = AsyncLoader(Steady(16, STALL_S / 2), batch_size=8, io_concurrency=1)
    with loader:
        assert _received(list(loader)) == list(range(16))
    assert dumps.texts == []


def test_a_slow_consumer_is_no_stall(monkeypatch, dumps):
    """The loader waits for a consumer whose step takes 3 x the threshold, its window full
    and nothing moving: that is the consumer's time, not a stall, and nothing is logged."""
    monkeypatch.setenv(STALL_DUMP_ENV, str(STALL_S))
    loader = AsyncLoader(Steady(12, 0.0), batch_size=4)
    got = []
    with loader:
        for batch in loader:
            time.sleep(3 * STALL_S)  # the training step
            got.append(batch)
    assert _received(got) == list(range(12))
    assert dumps.texts == []


def test_nothing_is_logged_when_unset(monkeypatch, dumps):
    """Without the variable (or with it empty) the loader watches nothing: a stall of 5 x the
    threshold logs nothing."""
    monkeypatch.delenv(STALL_DUMP_ENV, raising=False)
    source = Gated(64, stuck=(5,))
    loader = AsyncLoader(source, batch_size=BATCH)
    assert loader._options.stall_dump is None
    monkeypatch.setenv(STALL_DUMP_ENV, " ")
    assert AsyncLoader(source, batch_size=BATCH)._options.stall_dump is None

    def release() -> None:
        wait_event(source.reached[5], "sample 5 to be fetched")
        try:
            dumps.reach(1, 5 * STALL_S)
        finally:
            source.release(5)

    releaser = _in_background(release)
    with loader:
        assert _received(list(loader)) == list(range(64))
    releaser.join()
    assert dumps.texts == []


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "nan", "inf", "1s"])
def test_a_value_that_is_no_positive_number_is_refused(monkeypatch, raw):
    """Not a finite number of seconds above 0: ValueError at the constructor, naming the
    variable and its value."""
    monkeypatch.setenv(STALL_DUMP_ENV, raw)
    with pytest.raises(ValueError, match=rf"^{STALL_DUMP_ENV}='{raw}' must be a number of"):
        AsyncLoader(Steady(4, 0.0), batch_size=2)


def test_dump_state_from_another_thread_during_a_stall(monkeypatch):
    """``dump_state(loader)`` from a thread of the user's, while the consumer waits on a
    stuck sample: the epoch's stages read on its loop, its tasks and every thread."""
    monkeypatch.delenv(STALL_DUMP_ENV, raising=False)
    source = Gated(64, stuck=(20,))
    loader = AsyncLoader(source, batch_size=BATCH)
    texts: list[str] = []

    def look_then_release() -> None:
        wait_event(source.reached[20], "sample 20 to be fetched")
        texts.append(dump_state(loader))
        source.release(20)

    releaser = _in_background(look_then_release)
    with loader:
        assert _received(list(loader)) == list(range(64))
    releaser.join()
    (text,) = texts
    assert text.startswith("asyncloader: the state of AsyncLoader at ")
    for section in SECTIONS:
        assert section in text, (section, text)
    assert "epoch 0 of AsyncLoader" in text and "await gate.wait()" in text
    assert "test-releaser" in text and "in look_then_release" in text
    assert "(its event loop did not answer" not in text


def test_dump_state_of_an_idle_loader_has_the_threads():
    """Between epochs there is no stage to show: the dump is its title and the threads."""
    loader = AsyncLoader(Steady(8, 0.0), batch_size=4)
    with loader:
        list(loader)
        text = dump_state(loader)
    assert "epoch 0" not in text and "tasks on " not in text
    assert "threads (" in text and "MainThread" in text


class Blocking:
    """An async source whose sample ``stuck`` blocks the loop's thread (a user's bug: a
    blocking call inside ``async def``) until ``gate`` is set."""

    def __init__(self, n: int, stuck: int) -> None:
        self.n, self.stuck = n, stuck
        self.reached, self.gate = threading.Event(), threading.Event()

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray:
        if index == self.stuck:
            self.reached.set()
            self.gate.wait(WAIT_S)
        return sample(index)


def test_dump_state_of_a_blocked_loop_reads_it_from_the_calling_thread(monkeypatch):
    """A loop thread blocked inside a sample never answers: the dump says so, reads the
    stages from the calling thread and shows the blocking call in the loop thread's stack."""
    monkeypatch.delenv(STALL_DUMP_ENV, raising=False)
    source = Blocking(64, stuck=9)
    loader = AsyncLoader(source, batch_size=BATCH)
    texts: list[str] = []

    def look_then_release() -> None:
        try:
            wait_event(source.reached, "sample 9 to be fetched")
            texts.append(dump_state(loader))
        finally:
            source.gate.set()

    releaser = _in_background(look_then_release)
    with loader:
        assert _received(list(loader)) == list(range(64))
    releaser.join()
    (text,) = texts
    assert "(its event loop did not answer within 2 s: read from another thread)" in text
    assert "stages:" in text and "tasks on " in text
    assert "self.gate.wait(WAIT_S)" in text, text


def test_the_device_stage_is_shown_with_its_batches(monkeypatch):
    """With a device stage (``device_transform``, no CUDA needed) the dump counts the batches
    it moved and those out of it that the consumer has not taken."""
    monkeypatch.delenv(STALL_DUMP_ENV, raising=False)
    source = Gated(64, stuck=(40,))
    loader = AsyncLoader(source, batch_size=BATCH, device_transform=lambda batch: batch)
    texts: list[str] = []

    def look_then_release() -> None:
        try:
            wait_event(source.reached[40], "sample 40 to be fetched")
            texts.append(dump_state(loader))
        finally:
            source.release(40)

    releaser = _in_background(look_then_release)
    with loader:
        assert _received(list(loader)) == list(range(64))
    releaser.join()
    (text,) = texts
    assert "device   " in text and " moved, its room " in text, text
