"""The stall dump: what every stage of an epoch holds, for a report of a hang.

With ``ASYNCLOADER_STALL_DUMP=<seconds>`` in the environment when the loader is built
(``Options.stall_dump``), each epoch runs a :class:`StallWatch` on its event loop::

    call_later(seconds / TICKS) ─► tick: a counter moved, or the consumer is not waiting?
                                     │ yes: the stall clock restarts    │ no
                                     ▼                                  ▼
                                   re-arm                 waited >= seconds and not yet
                                                          logged this stall: log the dump

The counters are those the epoch keeps anyway (samples fetched, batches out of the engine and
the device stage, samples handed over, admissions into the window), so while batches flow
the watch costs one timer callback per ``seconds / TICKS`` and nothing per sample or batch.
A stall is logged once (WARNING, on this module's logger); after any progress the next one
is logged again. The dump is made on the loop, so a loop thread blocked inside a call never
reaches its tick: :func:`dump_epochs` from another thread (``asyncloader.diagnose.dump_state``)
covers that case, reading what it can from its own thread when the loop does not answer.

The dump only reads: it changes nothing in the epoch, and no stage waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from asyncloader._base import STALL_DUMP_ENV, ReorderBuffer, Window, thread_frames
from asyncloader._checkpoint import Progress
from asyncloader._config import Options
from asyncloader._pipeline.transform import Transformer
from asyncloader._tuning import EpochMeter

logger = logging.getLogger(__name__)

TICKS = 4  # checks per ``seconds``: a stall is logged within 1.25 x seconds of its start
ANSWER_S = 2.0  # how long a dump from another thread waits for the epoch's loop
SHOWN_INDICES = 16
FETCH_COUNTS = ("fetching", "queued", "active", "parked")  # what a fetcher may tell


@dataclass(frozen=True, slots=True)
class Parts:
    """An epoch's stages as they are now (``Epoch.parts()``), read on its loop's thread."""

    options: Options
    number: int
    meter: EpochMeter
    progress: Progress
    window: Window
    buffer: ReorderBuffer  # the reorder buffer
    out: ReorderBuffer  # what the consumer reads: the device stage's output, or the buffer
    fetcher: Any  # a Fetcher, a BatchFetcher or None (the engine fetches)
    transformer: Transformer | None
    device_room: asyncio.Semaphore
    prefetch: int
    inflight: Mapping[int, Sequence[Any]]  # seq -> indices, taken and not yet handed over
    waiting: bool  # the consumer waits for a batch now
    loop: asyncio.AbstractEventLoop | None
    task: asyncio.Task[None] | None

    def mark(self) -> tuple[int, ...]:
        """Counters that only grow, one of which moves with any progress of the epoch."""
        meter = self.meter
        counts = (meter.fetch.count, meter.engine.count, meter.device.count, meter.samples)
        return (*counts, self.window.admitted)


class HasParts(Protocol):
    loop: asyncio.AbstractEventLoop | None

    def parts(self) -> Parts: ...


class StallWatch:
    """Logs :func:`dump_epochs` once per stall of one epoch (see the module docstring); on its loop.

    Args:
        seconds: How long the consumer waits with no counter moving before the dump.
        parts: The epoch's :meth:`Parts` now.
    """

    def __init__(self, seconds: float, parts: Callable[[], Parts]) -> None:
        self._seconds, self._parts = seconds, parts
        self._loop = asyncio.get_running_loop()
        self._mark: tuple[int, ...] | None = None
        self._since = self._loop.time()
        self._logged = False
        self._timer = self._loop.call_later(seconds / TICKS, self._tick)

    def _tick(self) -> None:
        parts, at = self._parts(), self._loop.time()
        mark = parts.mark()
        if mark != self._mark or not parts.waiting:
            self._mark, self._since, self._logged = mark, at, False
        elif not self._logged and at - self._since >= self._seconds:
            self._logged = True
            title = (
                f"asyncloader: no progress for {at - self._since:.1f} s while the consumer "
                f"waits for a batch ({STALL_DUMP_ENV}={self._seconds:g}); the loader's state:"
            )
            logger.warning("%s", dump_epochs([parts], title))
        self._timer = self._loop.call_later(self._seconds / TICKS, self._tick)

    def close(self) -> None:
        self._timer.cancel()


@contextlib.contextmanager
def watch_stalls(seconds: float | None, parts: Callable[[], Parts]) -> Iterator[None]:
    """Within: a :class:`StallWatch` on the running loop (nothing when ``seconds`` is None)."""
    if seconds is None:
        yield
        return
    watch = StallWatch(seconds, parts)
    try:
        yield
    finally:
        watch.close()


def dump_epochs(epochs: Iterable[HasParts | Parts], title: str) -> str:
    """``title``, then per epoch still running its stages, limits and last tuner moves, then
    the tasks on each of their loops and every thread's stack. From any thread: what is read
    on a loop is read there, unless it does not answer within :data:`ANSWER_S`."""
    sections = [title]
    loops: list[asyncio.AbstractEventLoop] = []  # the epochs' loops, each once
    for epoch in epochs:
        parts = epoch if isinstance(epoch, Parts) else epoch.parts()
        if parts.task is not None and parts.task.done():
            continue
        if parts.loop is not None and parts.loop not in loops:
            loops.append(parts.loop)
        sections.append(_on_loop(parts.loop, functools.partial(describe, parts)))
    for loop in loops:
        sections.append(_on_loop(loop, functools.partial(loop_tasks, loop)))
    sections.append(thread_stacks())
    return "\n".join(sections)


def _on_loop(loop: asyncio.AbstractEventLoop | None, read: Callable[[], str]) -> str:
    """``read()`` on ``loop``'s thread; on this one where the loop is this thread's, not
    running, or does not answer (said in the text)."""
    try:
        here = asyncio.get_running_loop() is loop
    except RuntimeError:
        here = False
    if loop is None or here or loop.is_closed() or not loop.is_running():
        return _read_here(read, "")
    answer: concurrent.futures.Future[str] = concurrent.futures.Future()

    def answer_there() -> None:
        try:
            answer.set_result(read())
        except BaseException as exc:  # a figure that cannot be read: said, not raised
            answer.set_exception(exc)

    try:
        loop.call_soon_threadsafe(answer_there)
        return answer.result(ANSWER_S)
    except concurrent.futures.TimeoutError:
        note = f"(its event loop did not answer within {ANSWER_S:g} s: read from another thread)\n"
        return _read_here(read, note)
    except Exception as exc:
        return f"(could not be read: {exc!r})"


def _read_here(read: Callable[[], str], note: str) -> str:
    try:
        return note + read()
    except Exception as exc:  # a structure that changed while read from another thread
        return f"{note}(could not be read: {exc!r})"


def describe(parts: Parts) -> str:
    """The epoch's stages, limits and the last moves of its tuners, a line each."""
    options, meter = parts.options, parts.meter
    lines = [f"epoch {parts.number} of {options.loader_name}, {meter.elapsed():.1f} s in:"]
    lines.append("  stages:")
    lines += [f"    {name:<9}{text}" for name, text in _stages(parts)]
    lines.append("  limits:")
    lines += [f"    {text}" for text in _limits(parts)]
    lines.append(f"  tuner moves (the last {meter.tuned.maxlen} of this epoch):")
    for at, limit, prefetch, window in meter.tuned:
        lines.append(
            f"    +{at - meter.started:.2f} s: io limit {limit}, prefetch {prefetch}, "
            f"window {window}"
        )
    if not meter.tuned:
        lines.append("    none")
    return "\n".join(lines)


def _stages(parts: Parts) -> list[tuple[str, str]]:
    taken = f"{len(parts.inflight)} batches taken from the sampler, not yet handed over"
    return [
        ("fetch", _fetch(parts)),
        ("engine", _engine(parts)),
        ("reorder", _reorder(parts)),
        ("device", _device(parts)),
        ("consumer", _consumer(parts)),
        ("in all", taken),
    ]


def _fetch(parts: Parts) -> str:
    fetcher = parts.fetcher
    if fetcher is None:
        return "none on this loop: " + (
            "the engine fetches" if parts.options.engine_fetches else "an iterable source"
        )
    counts = [f"{getattr(fetcher, name)} {name}" for name in FETCH_COUNTS if hasattr(fetcher, name)]
    done = parts.meter.fetch.count
    return f"{type(fetcher).__name__}: samples {', '.join(counts)}; {done} fetched"


def _engine(parts: Parts) -> str:
    transformer = parts.transformer
    if transformer is None:
        return "not started"
    room, kind = transformer.room, type(transformer.engine).__name__
    return (
        f"{kind}, {parts.options.num_workers} workers: {room.ahead} of {room.size} batches in "
        f"it; {parts.meter.engine.count} made"
    )


def _reorder(parts: Parts) -> str:
    buffer = parts.buffer
    seq = buffer.next_seq
    wanted = "any" if seq is None else f"batch {seq}"
    if seq is not None and seq in parts.inflight:
        wanted += f" (indices {list(parts.inflight[seq])[:SHOWN_INDICES]})"
    ready = buffer.ready
    return f"{ready} ready, {len(buffer) - ready} pending; the consumer's next: {wanted}"


def _device(parts: Parts) -> str:
    if not parts.options.device_stage:
        return "none"
    full = "full" if parts.device_room.locked() else "not full"
    out = len(parts.out)
    return f"{parts.meter.device.count} moved, its room {full}; {out} out of it, not yet taken"


def _consumer(parts: Parts) -> str:
    meter = parts.meter
    return (
        f"{'waiting for a batch' if parts.waiting else 'not waiting'}; "
        f"{parts.progress.batches} batches ({meter.samples} samples) received, "
        f"{meter.waiting.level} made and not yet received; waited {meter.stall:.1f} s in all"
    )


def _limits(parts: Parts) -> list[str]:
    options, window = parts.options, parts.window
    limit = getattr(parts.fetcher, "limit", options.fetch_concurrency)

    def auto(on: bool) -> str:
        return '"auto"' if on else "fixed"

    return [
        f"io limit {limit} ({auto(options.auto_io)}, at most {options.fetch_concurrency})",
        f"window {window.ahead} of {window.size} batches ahead (at most {window.max_ahead} "
        f"so far; {window.blocked} of {window.admitted} admissions waited for a slot)",
        f"prefetch {parts.prefetch} ({auto(options.auto_prefetch)}), num_workers "
        f"{options.num_workers}, fetch_in_workers {options.fetch_in_workers}",
    ]


def loop_tasks(loop: asyncio.AbstractEventLoop) -> str:
    """The tasks on ``loop``, each with its chain of awaits down to what it waits on (a
    future, another task); tasks at the same place are shown once."""
    tasks = asyncio.all_tasks(loop)
    title = f"tasks on {type(loop).__module__}.{type(loop).__name__} ({len(tasks)}):"
    return _grouped(title, [(task.get_name(), *_awaits(task)) for task in tasks])


def thread_stacks() -> str:
    """Every thread's stack, innermost last; threads at the same place are shown once."""
    frames, names = thread_frames(), {t.ident: t.name for t in threading.enumerate()}
    stacks = [
        (names.get(ident, f"thread {ident}"), traceback.extract_stack(frame), None)
        for ident, frame in frames.items()
    ]
    return _grouped(f"threads ({len(frames)}):", stacks)


Stack = tuple[str, traceback.StackSummary, Any]  # a name, its frames, what it awaits (a task)


def _awaits(task: asyncio.Task[Any]) -> tuple[traceback.StackSummary, Any]:
    """The frames of ``task``'s coroutine and of each one it awaits (``cr_await``, through
    generators and async generators too), outermost first, and the object at the end of the
    chain (a future, a task; None when it runs or is done)."""
    frames: list[FrameType] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = next(
            (
                f
                for name in ("cr_frame", "gi_frame", "ag_frame")
                if (f := getattr(awaited, name, None))
            ),
            None,
        )
        if frame is None:  # a future, or a coroutine that has ended
            break
        frames.append(frame)
        awaited = next(
            (
                a
                for name in ("cr_await", "gi_yieldfrom", "ag_await")
                if (a := getattr(awaited, name, None))
            ),
            None,
        )
    summary = traceback.StackSummary.extract((frame, frame.f_lineno) for frame in frames)
    return summary, awaited


def _grouped(title: str, stacks: list[Stack]) -> str:
    """``title``, then each distinct stack once: how many share it, their first names."""
    groups: dict[tuple[Any, ...], list[Stack]] = {}
    for stack in stacks:
        _, summary, awaited = stack
        places = tuple((entry.filename, entry.lineno, entry.name) for entry in summary)
        groups.setdefault((places, type(awaited).__name__), []).append(stack)
    lines = [title]
    for group in sorted(groups.values(), key=len, reverse=True):
        names = ", ".join(name for name, _, _ in group[:4])
        more = f" and {len(group) - 4} more" if len(group) > 4 else ""
        lines.append(f"  {len(group)} x {names}{more}:")
        _, summary, awaited = group[0]
        for entry in summary.format():
            lines.append("  " + entry.rstrip("\n").replace("\n  ", "\n    "))
        if not summary:
            lines.append("    (no frames: not started yet)")
        if awaited is not None:
            lines.append(f"    awaiting {_short(repr(awaited))}")
    return "\n".join(lines)


def _short(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."
