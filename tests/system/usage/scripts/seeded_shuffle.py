"""shuffle=True with a seeded generator: the epochs' orders repeat from run to run."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    data = TensorDataset(torch.arange(30), torch.arange(30) % 5)
    loader = Loader(
        data, batch_size=8, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0)
    )
    for epoch in range(3):
        for x, y in loader:
            print(epoch, x.tolist(), y.tolist())


if __name__ == "__main__":
    main()
