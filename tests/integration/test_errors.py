"""Error propagation: original type and traceback, a note naming stage and samples; timeouts."""

import asyncio
import re
import time
import traceback

import pytest

from asyncloader import AsyncLoader, LoaderTimeoutError, RemoteTraceback
from tests.helpers import (
    CodedError,
    FailingSource,
    Hang,
    SyncSource,
    fail_on_five,
    failing_collate,
    indices_of,
)
from tests.helpers.contracts import steps


def consume(loader, mode, seen, on_error=lambda: None):
    """Iterates one epoch, appending each batch to `seen` before the error (if any) escapes;
    ``on_error()`` runs as it escapes (inside the event loop, for async)."""
    if mode == "sync":
        try:
            for batch in loader:
                seen.append(batch)
        except Exception:
            on_error()
            raise
        return

    async def run():
        try:
            async for batch in loader:
                seen.append(batch)
        except Exception:
            on_error()
            raise

    asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitem_error_keeps_type_attributes_and_traceback(mode, num_workers):
    """An exception with a custom constructor reaches the consumer intact, after batches 0-1."""
    seen = []
    loader = AsyncLoader(FailingSource(40, bad=9), batch_size=4, num_workers=num_workers)
    with pytest.raises(CodedError, match="cannot read 9") as info:
        consume(loader, mode, seen)
    exc = info.value
    assert exc.code == 7
    assert indices_of(seen) == list(range(8)), "batches before the failing one are delivered"
    assert "asyncloader: stage=fetch batch=2 index=9 indices=[8, 9, 10, 11]" in exc.__notes__
    text = "".join(traceback.format_exception(exc))
    assert "FailingSource raises here" in text and "helpers/sources.py" in text
    if num_workers:
        assert isinstance(exc.__cause__, RemoteTraceback)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_error_names_the_transform_stage(num_workers):
    """A transform failure is raised with stage=transform and the failing index."""
    loader = AsyncLoader(
        SyncSource(12), batch_size=4, transform=fail_on_five, num_workers=num_workers
    )
    with pytest.raises(ValueError, match="transform rejects 5") as info:
        list(loader)
    assert (
        "asyncloader: stage=transform batch=1 index=5 indices=[4, 5, 6, 7]" in info.value.__notes__
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_error_names_the_collate_stage(num_workers):
    """A collate_fn failure is raised with stage=collate and the batch's indices."""
    loader = AsyncLoader(
        SyncSource(8), batch_size=4, collate_fn=failing_collate, num_workers=num_workers
    )
    with pytest.raises(RuntimeError, match="collate gives up") as info:
        list(loader)
    assert "asyncloader: stage=collate batch=0 indices=[0, 1, 2, 3]" in info.value.__notes__


def test_async_getitem_error_is_raised_with_its_index():
    """An async __getitem__ failure names the fetch stage and the sample."""

    class Bad(SyncSource):
        async def __getitem__(self, index):
            raise KeyError(index)

    with pytest.raises(KeyError) as info:
        list(AsyncLoader(Bad(4), batch_size=2))
    assert "asyncloader: stage=fetch batch=0 index=0 indices=[0, 1]" in info.value.__notes__


def test_sampler_error_surfaces_with_its_stage():
    """A sampler that raises fails the epoch with stage=sampler."""

    def broken_sampler():
        yield 0
        raise RuntimeError("sampler broke")

    class Sampler:
        def __iter__(self):
            return broken_sampler()

        def __len__(self):
            return 3

    with pytest.raises(RuntimeError, match="sampler broke") as info:
        list(AsyncLoader(SyncSource(4), batch_size=None, sampler=Sampler()))
    assert "asyncloader: stage=sampler" in info.value.__notes__


def test_iterable_source_error_surfaces():
    """An exception from a sync iterator reaches the consumer with a fetch note."""

    class Stream:
        def __iter__(self):
            yield 1
            raise OSError("stream reset")

    with pytest.raises(OSError, match="stream reset") as info:
        list(AsyncLoader(Stream(), batch_size=2))
    assert any("stage=fetch" in note for note in info.value.__notes__)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_timeout_names_the_batch_it_waited_for(mode):
    """timeout > 0 raises LoaderTimeoutError naming the awaited batch; nothing hangs."""
    loader = AsyncLoader(Hang(12, stuck=5), batch_size=4, timeout=0.5)
    seen = []
    with pytest.raises(
        LoaderTimeoutError,
        match=r"AsyncLoader timed out after 0.5 seconds: .* batch 1 with indices \[4, 5, 6, 7\]",
    ):
        consume(loader, mode, seen)
    assert indices_of(seen) == [0, 1, 2, 3]


def test_a_user_timeout_error_is_not_mistaken_for_the_loader_timeout():
    """A TimeoutError raised by the source passes through as itself."""

    class Slow(SyncSource):
        async def __getitem__(self, index):
            raise TimeoutError("upstream timed out")

    with pytest.raises(TimeoutError, match="upstream timed out") as info:
        consume(AsyncLoader(Slow(4), batch_size=2, timeout=5), "async", [])
    assert not isinstance(info.value, LoaderTimeoutError)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_batch_raises_and_the_epoch_goes_on(mode, num_workers):
    """As in DataLoader: the failing batch raises from its step, later batches still come,
    each once, in order, and the state after the error skips the failed batch."""
    loader = AsyncLoader(FailingSource(40, bad=9), batch_size=4, num_workers=num_workers)
    got, errors = steps(loader, mode)
    assert [(type(e), str(e)) for e in errors] == [(CodedError, "cannot read 9")]
    assert indices_of(got) == [i for i in range(40) if not 8 <= i < 12]
    assert loader.stats.batches == 10


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_timeout_is_raised_after_about_timeout_seconds(mode, num_workers):
    """A sample stuck far longer than `timeout` gives LoaderTimeoutError (a RuntimeError, as
    DataLoader's) after about `timeout`, not when the sample returns or the workers stop."""
    from tests.helpers.sources import RELEASE_STUCK, StuckSource

    RELEASE_STUCK.clear()
    # Batch 0 must arrive within `timeout`, workers' start-up included (as DataLoader's first
    # batch): on a loaded 2-core CI machine that took over 0.5 s once, so workers get longer.
    timeout = 2.0 if num_workers else 0.5
    # A worker's sample returns at hold_s (RELEASE_STUCK cannot reach it): long enough to tell
    # an error at the timeout from one at the sample's return, short of the 5 s a closing
    # loader gives a busy worker before it terminates it.
    hold_s = timeout + 3.0
    loader = AsyncLoader(
        StuckSource(12, stuck=5, hold_s=hold_s), batch_size=4, timeout=timeout,
        num_workers=num_workers,
    )  # fmt: skip
    try:
        # Released before asyncio.run's own teardown: closing waits for a thread's stuck call.
        error, waited = time_to_error(loader, mode, then=RELEASE_STUCK.set)
    finally:
        RELEASE_STUCK.set()
        loader.close()
    assert isinstance(error, LoaderTimeoutError) and isinstance(error, RuntimeError)
    assert re.search(rf"timed out after {timeout:g} seconds: .* batch 1", str(error))
    assert waited < min(timeout + 2.5, hold_s), f"raised after {waited:.1f}s"


def time_to_error(loader, mode, then=lambda: None):
    """The exception an epoch raised, and the seconds from its start until it was raised
    (before asyncio.run's teardown); ``then()`` is called right after."""
    start, waited = time.monotonic(), []

    def on_error():
        waited.append(time.monotonic() - start)
        then()

    try:
        consume(loader, mode, [], on_error)
    except Exception as exc:
        return exc, waited[0]
    raise AssertionError("no error")
