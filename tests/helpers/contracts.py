"""Contract checkers: each checks one guarantee of the loader, through its public API only.

tests/integration/test_contracts.py runs every checker over every kind of source and placement; the
state
and sharded-resume tests use ``check_resume`` too. A checker raises AssertionError saying
what broke; tests/integration/test_contracts.py also feeds each one a wrong run to show that it can
fail.

The order and exactly-once checkers take batches as lists of sample ids (``epoch(loader,
key)`` with a ``key`` that maps a batch to its ids); the resume checker compares whatever
``key`` returns, JSON-able (``flat`` for tensors and dicts of tensors).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tests.helpers.sources import epoch_threads, loader_threads, worker_processes
from tests.helpers.waiting import await_event, wait_event

#: Ways to stop an epoch early: ``break`` out of ``for``, ``close()`` the loader mid-epoch
#: (its iterator still referenced), ``break`` out of ``async for`` inside ``async with``.
STOPS = ("break", "close", "aclose")


def flat(batch: Any) -> Any:
    """A comparable, JSON-able form of a batch (a tensor or a dict of tensors)."""
    if isinstance(batch, dict):
        return {k: v.tolist() for k, v in batch.items()}
    return batch.tolist()


def ran_ahead(loader: Any) -> threading.Event:
    """Set once ``loader``'s current epoch has had more than one batch ahead of its consumer."""
    return loader._last.ahead_reached(2)


def epoch(
    loader: Any, key: Callable[[Any], Any] = flat, *, mode: str = "sync", slow: bool = False
) -> list:
    """One epoch through ``for`` (``mode="sync"``) or ``async for`` (``"async"``), each batch
    as ``key(batch)``. ``slow``: a consumer that holds its first batch until the pipeline has
    run ahead of it (:func:`ran_ahead`), so that a bound on running ahead is exercised."""
    what = "the pipeline to run ahead of a held consumer"
    if mode == "sync":
        out = []
        for batch in loader:
            out.append(key(batch))
            if slow and len(out) == 1:
                wait_event(ran_ahead(loader), what)
        return out

    async def run() -> list:
        out = []
        async for batch in loader:
            out.append(key(batch))
            if slow and len(out) == 1:
                await await_event(ran_ahead(loader), what)
        return out

    return asyncio.run(run())


def steps(loader: Any, mode: str = "sync", key: Callable[[Any], Any] = lambda b: b) -> tuple:
    """One epoch stepped by hand, going on after a step that raises (as a DataLoader loop that
    logs and skips bad batches does): ``([key(batch), ...], [exception, ...])``, each in order."""
    got: list = []
    errors: list = []
    if mode == "sync":
        it = iter(loader)
        while True:
            try:
                got.append(key(next(it)))
            except StopIteration:
                return got, errors
            except Exception as exc:
                errors.append(exc)

    async def run() -> tuple:
        it = aiter(loader)
        while True:
            try:
                got.append(key(await anext(it)))
            except StopAsyncIteration:
                return got, errors
            except Exception as exc:
                errors.append(exc)

    return asyncio.run(run())


def check_order(batches: Sequence[Sequence], expected: Iterable) -> None:
    """Order: the samples of ``batches``, in delivery order, are ``expected``, in its order."""
    got, want = [s for b in batches for s in b], list(expected)
    at = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), None)
    if at is None and len(got) != len(want):
        at = min(len(got), len(want))
    assert at is None, (
        f"order broken at sample {at}: got {got[at : at + 4]}, expected {want[at : at + 4]} "
        f"({len(got)} samples delivered, {len(want)} expected)"
    )


def check_exactly_once(batches: Sequence[Sequence], expected: Iterable) -> None:
    """Exactly once: the samples of ``batches`` are those of ``expected``, each as often."""
    got, want = Counter(s for b in batches for s in b), Counter(expected)
    missing = sorted((want - got).elements(), key=repr)
    extra = sorted((got - want).elements(), key=repr)
    assert not missing and not extra, (
        f"missing {missing[:8]} ({len(missing)}); "
        f"more often than expected {extra[:8]} ({len(extra)})"
    )


def round_robin(streams: Sequence[Sequence[Any]], batch_size: int) -> list:
    """The samples, in order, of workers that each batch their own ``stream`` by
    ``batch_size`` and are taken one batch each in turn, an ended one dropping out
    (DataLoader's order for an iterable dataset with workers)."""
    batches = [
        [list(stream[i : i + batch_size]) for i in range(0, len(stream), batch_size)]
        for stream in streams
    ]
    out: list = []
    for turn in range(max((len(b) for b in batches), default=0)):
        for worker in batches:
            if turn < len(worker):
                out.extend(worker[turn])
    return out


def check_bounded_window(stats: Any) -> None:
    """Bounded window: batches ahead of the consumer never exceeded ``stats.window``, samples
    being fetched never exceeded ``stats.io_concurrency``; and the pipeline did run ahead
    (``max_ahead > 1``), so the bound was exercised, which a slow consumer ensures
    (``epoch(..., slow=True)``)."""
    assert 1 < stats.max_ahead <= stats.window, (
        f"max_ahead={stats.max_ahead} must be in (1, window={stats.window}]"
    )
    assert 0 <= stats.max_fetching <= stats.io_concurrency, (
        f"max_fetching={stats.max_fetching} exceeds io_concurrency={stats.io_concurrency}"
    )


def check_clean_shutdown(loader: Any, stop: str) -> None:
    """Clean shutdown: after one batch, stop the epoch by ``stop`` (one of STOPS); by then
    no thread and no worker process it started is left. After ``break`` the loader's own
    ``asyncloader-loop`` thread (shared by its ``for`` epochs) may stay, until ``close()``."""
    threads, procs = loader_threads(), worker_processes()
    if stop == "break":
        for _ in loader:
            break
        left = sorted(t.name for t in epoch_threads() - threads)
        assert not left, f"epoch threads left after break: {left}"
        assert not worker_processes() - procs, "worker processes left after break"
        loader.close()
    elif stop == "close":
        it = iter(loader)
        next(it)
        loader.close()
    elif stop == "aclose":

        async def run() -> None:
            async with loader:
                async for _ in loader:
                    break

        asyncio.run(run())
    else:
        raise ValueError(f"{stop=} must be one of {STOPS}")
    left = sorted(t.name for t in loader_threads() - threads)
    assert not left, f"threads left after {stop}: {left}"
    assert not worker_processes() - procs, f"worker processes left after {stop}"


def check_repeatable(
    make_loader: Callable[..., Any], key: Callable[[Any], Any], counts: Sequence[int] = (2, 2, 1)
) -> None:
    """Random draws in the workers repeat with the same seed: runs with ``counts`` workers
    (two runs with 2 workers and one with 1 by default) give equal batches, draws included
    (``make_loader(num_workers=n, seed=s)``), and another seed gives other draws."""
    runs = [epoch(make_loader(num_workers=n, seed=1), key) for n in counts]
    assert runs[0] == runs[1], "two runs with the same seed drew differently"
    for n, run in zip(counts[2:], runs[2:], strict=True):
        assert runs[0] == run, f"{counts[0]} and {n} workers drew differently with the same seed"
    assert epoch(make_loader(num_workers=2, seed=2), key) != runs[0], "another seed, same draws"


def check_resume(
    make_loader: Callable[..., Any],
    points: Iterable[int] | None = None,
    *,
    key: Callable[[Any], Any] = flat,
    in_order: bool = True,
    save_with: dict | None = None,
    resume_with: dict | None = None,
) -> None:
    """Resume: the state after k batches, for each k of ``points`` (every position, 0 to the
    epoch's length, when None), taken in one epoch and round-tripped through JSON, loaded
    into a fresh ``make_loader(**resume_with)`` that finishes the epoch there.

    With ``in_order`` the batches after the resume equal the uninterrupted epoch's after k,
    batch for batch; without, together with its first k they are its batches, each once.
    ``save_with`` and ``resume_with`` are the two loaders' own keyword arguments.
    """
    save_with, resume_with = save_with or {}, resume_with or {}
    reference, states = _epoch_with_states(make_loader(**save_with), key, points)
    for k, state in states.items():
        second = make_loader(**resume_with)
        second.load_state_dict(state)
        rest = epoch(second, key)
        if in_order:
            assert rest == reference[k:], f"resumed after {k}: the batches after differ"
        else:
            as_text = [json.dumps(b) for b in reference[:k] + rest]
            check_exactly_once([as_text], (json.dumps(b) for b in reference))


def _epoch_with_states(
    loader: Any, key: Callable[[Any], Any], points: Iterable[int] | None
) -> tuple[list, dict[int, dict]]:
    """One epoch of ``loader`` (as ``key(batch)``) and its ``state_dict()`` after each k
    batches of ``points`` (every k when None), each through JSON as a checkpoint file
    carries it, taken while the epoch runs on, as a training loop checkpoints."""
    wanted = None if points is None else set(points)
    states: dict[int, dict] = {}
    batches: list = []

    def keep(k: int) -> None:
        if wanted is None or k in wanted:
            states[k] = json.loads(json.dumps(loader.state_dict()))

    it = iter(loader)
    keep(0)
    for batch in it:
        batches.append(key(batch))
        keep(len(batches))
    missing = set() if wanted is None else wanted - states.keys()
    assert not missing, f"resume points {sorted(missing)} are past the epoch's {len(batches)}"
    return batches, states


def state_after(loader: Any, k: int) -> dict:
    """``loader``'s ``state_dict()`` after ``k`` batches of its next epoch, through JSON (as
    a checkpoint file would carry it); the epoch is closed."""
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    return state
