"""Two loaders zipped (source and target domains), of different lengths, over 2 epochs."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    source = Loader(TensorDataset(torch.arange(30)), batch_size=4, num_workers=2)
    target = Loader(TensorDataset(torch.arange(100, 120)), batch_size=4, num_workers=2)
    for epoch in range(2):
        for (s,), (t,) in zip(source, target, strict=False):  # stops at the shorter
            print(epoch, s.tolist(), t.tolist())


if __name__ == "__main__":
    main()
