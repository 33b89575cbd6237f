"""An IterableDataset that shards its stream by worker with get_worker_info(), as DataLoader's
documentation shows.

The one change for AsyncLoader: fetch_in_workers=True. Without it AsyncLoader iterates the
dataset once, in the training process (get_worker_info() is None there), so every sample
arrives once but the batches are cut from one stream (3-6, 7-10, ...), where DataLoader's
come from each worker's shard in turn (3-6, 17-20, 7-10, ...).
"""

import math
import os

import torch
from torch.utils.data import IterableDataset, get_worker_info

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader

    OPTIONS = {"fetch_in_workers": True}  # run one copy of the iterable per worker
else:
    from torch.utils.data import DataLoader as Loader

    OPTIONS = {}


class Range(IterableDataset):
    def __init__(self, start, end):
        self.start = start
        self.end = end

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            lo, hi = self.start, self.end
        else:
            per_worker = math.ceil((self.end - self.start) / info.num_workers)
            lo = self.start + info.id * per_worker
            hi = min(lo + per_worker, self.end)
        for i in range(lo, hi):
            yield torch.tensor([i, i * i])


def main():
    loader = Loader(Range(3, 30), batch_size=4, num_workers=2, **OPTIONS)
    for epoch in range(2):
        for batch in loader:
            print(epoch, batch.tolist())


if __name__ == "__main__":
    main()
