"""next(iter(loader)) called repeatedly to peek at a batch, shuffled with a seeded generator."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    data = TensorDataset(torch.arange(40), torch.arange(40) * 2)
    loader = Loader(
        data,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    for _ in range(5):
        x, y = next(iter(loader))
        print(x.tolist(), y.tolist())


if __name__ == "__main__":
    main()
