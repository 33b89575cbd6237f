"""Numbers an epoch's batches: ``(seq, indices, samples)`` from the sampler or the stream.

``seq`` is the batch's position in the whole epoch, also in a resumed one: positions the
consumer already received before the checkpoint are stepped over, so a resumed epoch yields
exactly the batches the interrupted one had not delivered, under the same numbers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

from asyncloader._base import Samples, source_state, sync_stream, take_async, take_sync
from asyncloader._checkpoint import Progress, Resume
from asyncloader._config import Options
from asyncloader._pipeline.claims import Claim
from asyncloader._pipeline.heavy_source import PullMeter


class Made:
    """A batch a worker made from its own iteration of an iterable source (still as it left
    the worker): nothing is left to do but receive it."""

    __slots__ = ("result",)

    def __init__(self, result: Any) -> None:
        self.result = result


#: ``(seq, indices, samples)``: samples ``None`` when they are yet to be fetched.
Batch = tuple[int, Sequence[Any], "Samples | Made | None"]


async def map_batches(
    options: Options, index_iter: Iterator[Any], resume: Resume
) -> AsyncGenerator[Batch, None]:
    """Batches of indices from the (batch) sampler; samples are fetched later (None here)."""
    for seq in itertools.count():
        try:
            indices = next(index_iter)
        except StopIteration:
            return
        except Exception as exc:
            exc.add_note("asyncloader: stage=sampler")
            raise
        if seq < resume.start or seq in resume.skip:
            continue
        yield seq, (indices if options.batched else [indices]), None


async def stream_batches(
    options: Options,
    iterator: Any,
    claim: tuple[Claim, object] | None,
    resume: Resume,
    first_seq: int,
    progress: Progress,
    thread: Executor | None,
) -> AsyncGenerator[Batch, None]:
    """Batches of samples pulled from an iterable source; indices are stream offsets.

    Args:
        iterator: What the source's ``__iter__`` (``__aiter__``) returned.
        claim: ``(claim, token)`` when ``iterator`` is the dataset itself: each pull first
            checks that no newer epoch took the object over (:mod:`asyncloader._pipeline.claims`).
        first_seq: The seq of the next batch the source will give (``resume.start`` when the
            source restored its own state, else 0 and earlier batches are pulled and dropped).
        progress: Told the source's own state before each batch, when the source keeps one.
        thread: Where a sync source is pulled (off the loop's thread); ``None`` for async ones.
    """
    size = options.batch_size or 1
    dataset, stateful = options.dataset, progress.tracks_source
    source_ait = None
    if thread is not None:
        meter = PullMeter(dataset, options.num_workers)
        pull = _sync_puller(dataset, iterator, claim, size, stateful, thread, meter)
    else:
        source_ait = iterator

        async def pull() -> tuple[Samples, Any]:
            if claim is not None:
                claim[0].check(claim[1])
            items = await take_async(source_ait, size)
            return items, source_state(dataset, source_ait) if stateful else None

    try:
        for seq in itertools.count(first_seq):
            try:
                samples, state_after = await pull()
            except Exception as exc:
                exc.add_note(f"asyncloader: stage=fetch stream_offset={seq * size}")
                raise
            if not samples or (options.drop_last and len(samples) < size):
                return
            if stateful:
                progress.source_state_before(seq + 1, state_after)
            if seq < resume.start or seq in resume.skip:
                continue
            yield seq, range(seq * size, seq * size + len(samples)), samples
    finally:
        if source_ait is not None and hasattr(source_ait, "aclose"):
            await source_ait.aclose()


def _sync_puller(
    dataset: Any,
    iterator: Iterator[Any],
    claim: tuple[Claim, object] | None,
    size: int,
    stateful: bool,
    thread: Executor,
    meter: PullMeter,
) -> Callable[[], Awaitable[tuple[Samples, Any]]]:
    """Pulls ``size`` items at a time from a sync iterable's ``iterator`` on ``thread``
    (under the dataset's claim when it is its own iterator), timed by ``meter``."""
    loop = asyncio.get_running_loop()
    stream = sync_stream(dataset, iterator)

    def take() -> tuple[list[Any], Any]:
        return take_sync(dataset, iterator, stream, size, stateful)

    if claim is not None:
        owner, token = claim
        unclaimed = take

        def take() -> tuple[list[Any], Any]:
            with owner.lock:
                owner.check(token)
                return unclaimed()

    timed = meter.timed(take)
    return lambda: loop.run_in_executor(thread, timed)
