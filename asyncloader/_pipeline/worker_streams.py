"""An iterable source run in the workers: each iterates its own copy, batches taken in turn.

With ``fetch_in_workers=True`` every worker iterates its own copy of an iterable source (so
the work inside ``__iter__`` runs on every worker; the library's sharded sources and a
``torch.utils.data.IterableDataset`` that calls ``get_worker_info()`` give each worker its
own part). The epoch takes their batches round robin, DataLoader's order::

    worker 0's batch 0, worker 1's batch 0, ..., worker 0's batch 1, worker 1's batch 1, ...

a worker whose iteration has ended dropping out of the turn. So the order depends on what each
worker's iteration yields, never on timing. With ``in_order=False`` the epoch takes whichever
worker's next batch is ready first (DataLoader's ``in_order=False``): a worker held up by its
storage does not hold up the others; each worker's own batches keep their order.

Each worker first opens its iteration and reports the source's own state then (what
``state_dict()`` holds before the first batch), and is asked for ``prefetch`` batches ahead
of the one the epoch waits for from it.
Resume: the state before each batch records, per worker, the batches delivered, whether its
iteration ended, and the source's own state after its last delivered batch (when it keeps
one); a resumed worker restores that state, or else replays its delivered batches and drops
them, and the turn continues where it was.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from asyncloader._base import tracing
from asyncloader._checkpoint import Progress, fresh_state
from asyncloader._config import Options
from asyncloader._engines import WorkerEngine
from asyncloader._pipeline.batches import Batch, Made
from asyncloader._pipeline.epoch_start import EpochStart
from asyncloader._worker import LOST, SUPERSEDED, Ended, StreamOpen
from asyncloader.errors import AsyncLoaderError, WorkerCrashedError


async def worker_stream_batches(
    engine: WorkerEngine,
    options: Options,
    start: EpochStart,
    progress: Progress,
    crashed: Callable[[BaseException], Awaitable[BaseException]],
    made_by: Callable[[int, int], None],
) -> AsyncGenerator[Batch, None]:
    """The epoch's batches, made by the workers' own iterations, round robin.

    Liveness: every worker still in the turn has at least one batch asked ahead (``prefetch``
    >= 1 at the start, one more for each taken; cleared only when it ended), so the future
    awaited next (or one of those ``_first_ready`` waits on) exists, and the engine completes
    it: the answer, ``BrokenProcessPool`` when the worker dies, or the worker's own
    SUPERSEDED/LOST. Inside a worker, requests are served by number under ``stream.turn``,
    whose holder advances ``next`` and notifies all in a ``finally``.

    Args:
        engine: The workers, each iterating its own copy of the source.
        start: The epoch's start; its ``source_state`` holds the merge state to continue.
        progress: Told the merge state before each batch (what ``state_dict()`` saves).
        crashed: The error to raise for a worker that died (it names the worker and how).
        made_by: Told which worker made each batch (``loader.stats``' waits per worker).
    """
    n = engine.num_workers
    saved = start.source_state[1] if start.source_state is not None else fresh_state(n)
    workers = copy.deepcopy(saved["per_worker"])
    token = engine.new_token()
    asked = [w["delivered"] for w in workers]  # the next batch number to ask each for
    ahead: list[deque[asyncio.Future[Any]]] = [deque() for _ in range(n)]

    openings = _openings(options, start, token, workers)

    def ask(w: int, count: int = 1) -> None:
        for _ in range(count):
            ahead[w].append(asyncio.wrap_future(engine.next_stream(w, openings[w], asked[w])))
            asked[w] += 1

    seq, w = start.first_seq, saved["next"]
    try:
        live = [i for i, worker in enumerate(workers) if not worker["ended"]]
        opened = [asyncio.wrap_future(engine.open_stream(i, openings[i])) for i in live]
        for i in live:
            ask(i, options.prefetch)
        _opened_states(workers, live, await asyncio.gather(*opened))
        progress.source_state_before(seq, _merge_state(workers, w))
        progress.source_opened()
        while not all(worker["ended"] for worker in workers):
            if not options.in_order:
                w = await _first_ready(ahead, workers, w)
            elif workers[w]["ended"]:
                w = (w + 1) % n
                continue
            answer = _checked(await ahead[w].popleft(), w)
            if isinstance(answer, Ended):
                _ended(workers[w], ahead[w], answer)
                continue
            indices, result, state = answer
            tracing.alias(seq, workers[w]["delivered"] * n + w)  # the arrow of its batch
            made_by(seq, w)
            workers[w]["delivered"] += 1
            workers[w]["state"] = state
            ask(w)
            w = (w + 1) % n
            progress.source_state_before(seq + 1, _merge_state(workers, w))
            yield seq, indices, Made(result)
            seq += 1
        # After the last batch: every worker's final state, which the next epoch starts from.
        progress.source_state_before(seq, _merge_state(workers, w))
    except BrokenProcessPool as exc:  # a worker died (asking it, or while it worked)
        raise await crashed(exc) from exc
    finally:
        progress.source_opened()
        for queue in ahead:
            _cancel(queue)


def _openings(
    options: Options, start: EpochStart, token: int, workers: list[dict[str, Any]]
) -> list[StreamOpen]:
    """How each worker opens its iteration of this epoch: seed, and where to continue."""
    epoch = start.number if options.distributed else None
    resumed = bool(start.resume.start or start.resume.skip)
    return [
        StreamOpen(token, start.seed + w, worker["delivered"], worker["state"], epoch, resumed)
        for w, worker in enumerate(workers)
    ]


def _opened_states(workers: list[dict[str, Any]], live: list[int], answers: list[Any]) -> None:
    """What each worker's ``__iter__`` (and a restored state) made is the state before the
    first batch, as it is without workers; ``state_dict()`` waits for it (Progress)."""
    for i, answer in zip(live, answers, strict=True):
        if answer not in (LOST, SUPERSEDED) and answer is not None:
            workers[i]["state"] = answer


def _checked(answer: Any, w: int) -> Any:
    """``answer`` from worker ``w``, unless it says the iteration is no longer this epoch's.

    Raises:
        AsyncLoaderError: A newer epoch took the persistent workers' iteration over.
        WorkerCrashedError: The worker was restarted and lost its place.
    """
    if answer == SUPERSEDED:
        raise AsyncLoaderError(
            "a newer epoch of this loader took over its persistent workers' iteration "
            "of the source: they iterate one epoch at a time, as DataLoader's do"
        )
    if answer == LOST:
        raise WorkerCrashedError(
            f"worker {w} has lost its iteration of the source (it was restarted): the "
            "epoch cannot go on exactly once. Resume from the last state_dict()."
        )
    return answer


def _ended(worker: dict[str, Any], ahead: deque[asyncio.Future[Any]], answer: Ended) -> None:
    """A worker's iteration ended: it leaves the turn with its final state."""
    worker["ended"] = True
    worker["state"] = answer.state
    _cancel(ahead)


def _cancel(ahead: deque[asyncio.Future[Any]]) -> None:
    """Cancels the batches asked of a worker ahead, and forgets them."""
    for future in ahead:
        future.cancel()
    ahead.clear()


async def _first_ready(
    ahead: list[deque[asyncio.Future[Any]]], workers: list[dict[str, Any]], turn: int
) -> int:
    """``in_order=False``: the worker whose next batch is ready, the first in turn from
    ``turn`` when several are (waiting for the first to be when none is)."""
    order = [(turn + k) % len(workers) for k in range(len(workers))]
    live = [w for w in order if not workers[w]["ended"]]
    if not any(ahead[w][0].done() for w in live):
        await asyncio.wait([ahead[w][0] for w in live], return_when=asyncio.FIRST_COMPLETED)
    return next(w for w in live if ahead[w][0].done())


def _merge_state(workers: list[dict[str, Any]], turn: int) -> dict[str, Any]:
    """A snapshot of the merge: each worker's record copied (a record's ``state`` is replaced,
    never changed, and came from the worker as a copy already)."""
    return {"per_worker": [dict(worker) for worker in workers], "next": turn}
