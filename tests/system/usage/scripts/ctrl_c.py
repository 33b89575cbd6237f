"""A training loop that the user interrupts with Ctrl-C mid-epoch: it prints "started" once
the epoch runs, then trains until interrupted."""

import os
import time

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class SlowReads(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.002)  # a read from a slow disk
        return torch.tensor([i, i + 1])


def main():
    loader = Loader(SlowReads(), batch_size=8, num_workers=2)
    for step, batch in enumerate(loader):
        batch.float().mean()
        if step == 3:
            print("started")
    print("finished")


if __name__ == "__main__":
    main()
