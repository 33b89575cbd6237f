"""A training process that tests/system/engines/test_hygiene.py kills: it iterates an AsyncLoader
with 2
workers over a million slow samples and prints "ready" once it has its first batch.

``python train_forever.py {main,thread} {default,forkserver,...} [fetch-in-workers]``: iterate
in the main thread or in another thread, with the default start method (fork, in either) or
the one named; ``fetch-in-workers``: with ``fetch_in_workers=True`` (the workers of
asyncloader._engines.fetching_workers).
"""

import sys
import threading

from asyncloader import AsyncLoader
from tests.helpers import SyncSource


def train(mp_context: str | None, fetch_in_workers: bool = False) -> None:
    loader = AsyncLoader(
        SyncSource(10**6), batch_size=4, num_workers=2, mp_context=mp_context,
        fetch_in_workers=fetch_in_workers,
    )  # fmt: skip
    for k, _ in enumerate(loader):
        if k == 0:
            print("ready", flush=True)


if __name__ == "__main__":
    where, start = sys.argv[1:3]
    mp_context = None if start == "default" else start
    in_workers = sys.argv[3:] == ["fetch-in-workers"]
    if where == "main":
        train(mp_context, in_workers)
    else:
        thread = threading.Thread(target=train, args=(mp_context, in_workers), name="trainer")
        thread.start()
        thread.join()
