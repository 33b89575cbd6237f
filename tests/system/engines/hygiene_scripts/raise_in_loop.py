"""A training step that raises while its process holds the loader's iterator: 1
worker, a million samples of 10 ms each, so the epoch is far from over.

``python raise_in_loop.py {plain,fork,spawn} JOIN_S``: ``plain`` raises in this script;
``fork`` and ``spawn`` raise in a ``multiprocessing.Process`` child of that start method, which
this script joins for at most ``JOIN_S`` seconds and then prints ``exitcode N`` (``None``: it
had not exited, and is killed). The process that raises prints "raising" first.
"""

import multiprocessing
import sys
import time

import torch

from asyncloader import AsyncLoader


class Slow(torch.utils.data.Dataset):
    """A million samples of 10 ms each: the epoch is far from over at the raise."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> int:
        time.sleep(0.01)
        return index


def train() -> None:
    loader = AsyncLoader(Slow(), batch_size=1, shuffle=True, num_workers=1)
    batches = iter(loader)  # held by the frame, which the traceback keeps alive
    for _ in batches:
        print("raising", flush=True)
        raise RuntimeError("the training step failed")


if __name__ == "__main__":
    how, join_s = sys.argv[1], float(sys.argv[2])
    if how == "plain":
        train()
    else:
        child = multiprocessing.get_context(how).Process(target=train, name="trainer")
        child.start()
        child.join(join_s)
        print(f"exitcode {child.exitcode}", flush=True)
        if child.exitcode is None:
            child.kill()
            child.join()
