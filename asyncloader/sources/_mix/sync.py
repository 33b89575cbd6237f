"""The sync iteration of a :class:`~asyncloader.sources.Mix` (all its sources sync), on the
loader's puller thread: draws made a block at a time, map-style samples read ``READ`` at a
time and handed out from a list, an iterable source's one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from asyncloader.sources._mix.draw import Layout
from asyncloader.sources._mix.run import BLOCK, Run, took
from asyncloader.sources._mix.sources import close_sync, open_sync, skip_sync

#: Map-style samples read at once, ahead of the one handed out (the memory it takes).
READ = 128


class SyncRun(Run):
    """A Run of sync sources, iterated by :func:`sync_samples`."""

    def __init__(self, mix: Any, began: dict[str, Any], layout: Layout) -> None:
        super().__init__(mix, began, layout)
        self.getters = [m.source.__getitem__ if m.is_map else None for m in self.members]
        self.pulled: Any = None

    def map_end(self, picks: list[int], start: int) -> int:
        """The end of the map-style draws of ``picks`` from ``start``, at most ``READ`` of
        them."""
        end = min(len(picks), start + READ)
        if not self.iterable:
            return end
        getters = self.getters
        for k in range(start, end):
            if getters[picks[k]] is None:
                return k
        return end

    def read(
        self, picks: list[int], items: list[Any], start: int, end: int
    ) -> tuple[list[Any], BaseException | None]:
        """The samples of map-style draws ``start`` to ``end`` (of the cursor's), read now;
        when one fails, those before it and its error (named: :meth:`note`)."""
        getters, samples = self.getters, list[Any]()
        append = samples.append
        try:
            for k in range(start, end):
                append(getters[picks[k]](items[k]))  # type: ignore[misc]
        except Exception as exc:
            k = start + len(samples)
            self.note(exc, picks[k], items[k], k - start)
            return samples, exc
        return samples, None

    def pull_one(self, i: int) -> bool:
        """Reads the next sample of iterable source ``i`` into :attr:`pulled`, counted;
        False when it had none left (its stop rule applied)."""
        try:
            self.pulled = self.pull(i)
        except StopIteration:
            self.ran_out(i)
            return False
        except Exception as exc:
            self.note(exc, i, None)
            raise
        self.cursor.took(i)
        return True

    def pull(self, i: int) -> Any:
        """The next sample of iterable source ``i`` (opened where its place says first)."""
        iterator = self.iterators.get(i)
        if iterator is None:
            iterator = self.iterators[i] = self._open(i)
        return next(iterator)

    def _open(self, i: int) -> Iterator[Any]:
        c, member = self.cursor, self.members[i]
        left = c.taken[i] - c.own_taken[i]
        while True:
            iterator = open_sync(member, c.epochs[i], c.own[i])
            left = self.replay_left(i, skip_sync(iterator, left), left)
            if not left:
                return iterator
            close_sync(member, iterator)

    def ran_out(self, i: int) -> None:
        close_sync(self.members[i], self.iterators.pop(i, None))
        super().ran_out(i)

    def close(self) -> None:
        self.keep_own()
        for i, iterator in self.iterators.items():
            close_sync(self.members[i], iterator)
        self.iterators.clear()


def sync_samples(run: SyncRun) -> Iterator[Any]:
    """The samples of ``run``'s epoch, each counted in the run's cursor before it goes out:
    map-style samples read a block at a time and handed out from a list (counted by what is
    left of it, see :attr:`Run.segment`), an iterable's one at a time."""
    c = run.cursor
    try:
        while True:
            picks, items, _ = run.block(c, BLOCK)
            if not picks:
                break
            start = 0
            while start < len(picks):
                end = run.map_end(picks, start)
                if end == start:  # an iterable source's draw
                    if not run.pull_one(picks[start]):
                        break  # it ran out: the draws after it may change, drawn again
                    yield run.pulled
                    start += 1
                    continue
                samples, failure = run.read(picks, items, start, end)
                run.segment = (picks[start:end], iter(samples))
                yield from run.segment[1]
                took(c, run.segment[0])
                run.segment = None
                if failure is not None:
                    raise failure
                start = end
        run.ended()
    finally:
        run.close()
