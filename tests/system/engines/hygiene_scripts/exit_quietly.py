"""Iterates two loaders with 2 workers each (``persistent_workers`` off and on) and exits,
normally or by raising while it holds a live iterator of each: tests/system/engines/test_hygiene.py
reads its
stderr for the resource tracker's "leaked semaphore" warning.

``python exit_quietly.py {finish,raise} {default,forkserver}``. The loaders run in the main
thread while an idle thread is alive; their workers are forked (the default) or start through
the fork server, whose semaphores the resource tracker watches (forked pools unlink theirs at
once: no tracker runs).
"""

import sys
import threading

import psutil

from asyncloader import AsyncLoader
from tests.helpers import SyncSource, indices_of


def train(end: str, mp_context: str | None) -> None:
    loaders = [
        AsyncLoader(SyncSource(40), batch_size=4, num_workers=2, persistent_workers=persistent,
                    mp_context=mp_context)
        for persistent in (False, True)
    ]  # fmt: skip
    for loader in loaders:
        for _ in range(2):
            assert indices_of(loader) == list(range(40))
    kinds = {
        kind
        for child in psutil.Process().children()
        for kind in ("forkserver", "resource_tracker")
        if kind in " ".join(child.cmdline())
    }
    print("children:", *sorted(kinds), flush=True)
    if end == "raise":
        batches = [iter(loader) for loader in loaders]  # held by the frame, as is each loader
        for it in batches:
            next(it)
        raise RuntimeError("the training step failed")


if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, name="idle", daemon=True).start()
    train(sys.argv[1], None if sys.argv[2] == "default" else sys.argv[2])
