"""Numbers an epoch's batches: ``(seq, indices, samples)`` from the sampler or the stream.

``seq`` is the batch's position in the whole epoch, also in a resumed one: positions the
consumer already received before the checkpoint are stepped over, so a resumed epoch yields
exactly the batches the interrupted one had not delivered, under the same numbers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from typing import Any

from asyncloader._config import Config
from asyncloader._state import Resume
from asyncloader._threads import loader_threads
from asyncloader.sources import SourceKind

Batch = tuple[int, Sequence[Any], list[Any] | None]


async def map_batches(
    cfg: Config, index_iter: Iterator[Any], resume: Resume
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
        yield seq, (indices if cfg.batched else [indices]), None


async def stream_batches(
    cfg: Config,
    resume: Resume,
    first_seq: int,
    states: dict[int, Any] | None,
    closers: list[Callable[[], None]],
) -> AsyncGenerator[Batch, None]:
    """Batches of samples pulled from an iterable source; indices are stream offsets.

    Args:
        first_seq: The seq of the next batch the source will give (``resume.start`` when the
            source restored its own state, else 0 and earlier batches are pulled and dropped).
        states: When the source keeps state, filled with ``seq -> source state before it``.
    """
    size = cfg.batch_size or 1
    if cfg.kind is SourceKind.ITERABLE:
        pull = _sync_puller(cfg.dataset, size, states is not None, closers)
        source_ait = None
    else:
        source_ait = aiter(cfg.dataset)

        async def pull() -> tuple[list[Any], Any]:
            items = await _take_async(source_ait, size)
            return items, cfg.dataset.state_dict() if states is not None else None

    try:
        for seq in itertools.count(first_seq):
            try:
                samples, state_after = await pull()
            except Exception as exc:
                exc.add_note(f"asyncloader: stage=fetch stream_offset={seq * size}")
                raise
            if not samples or (cfg.drop_last and len(samples) < size):
                return
            if states is not None:
                states[seq + 1] = state_after
            if seq < resume.start or seq in resume.skip:
                continue
            yield seq, range(seq * size, seq * size + len(samples)), samples
    finally:
        if source_ait is not None and hasattr(source_ait, "aclose"):
            await source_ait.aclose()


def _sync_puller(
    dataset: Any, size: int, stateful: bool, closers: list[Callable[[], None]]
) -> Callable[[], Awaitable[tuple[list[Any], Any]]]:
    """Pulls ``size`` items at a time from a sync iterable, off the loop's thread."""
    loop = asyncio.get_running_loop()
    thread = loader_threads(1, "asyncloader-source")
    closers.append(lambda: thread.shutdown(wait=True, cancel_futures=True))
    holder: list[Iterator[Any]] = []

    def take() -> tuple[list[Any], Any]:
        if not holder:
            holder.append(iter(dataset))
        items = list(itertools.islice(holder[0], size))
        return items, dataset.state_dict() if stateful else None

    return lambda: loop.run_in_executor(thread, take)


async def _take_async(ait: Any, size: int) -> list[Any]:
    samples = []
    for _ in range(size):
        try:
            samples.append(await anext(ait))
        except StopAsyncIteration:
            break
    return samples


def start_sampler(cfg: Config) -> Iterator[Any]:
    """The (batch) sampler's iterator with its first element drawn now (errors kept for later)."""
    it = iter(cfg.batch_sampler if cfg.batch_sampler is not None else cfg.sampler)
    try:
        first = next(it)
    except StopIteration:
        return iter(())
    except Exception as exc:
        return _raising(exc)
    return itertools.chain((first,), it)


def _raising(exc: Exception) -> Iterator[Any]:
    raise exc
    yield
