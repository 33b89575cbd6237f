"""pin_memory=True (without CUDA DataLoader warns and passes the batches through)."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    data = TensorDataset(torch.arange(20).reshape(10, 2).float(), torch.arange(10))
    loader = Loader(data, batch_size=3, num_workers=2, pin_memory=True)
    for epoch in range(2):
        for x, y in loader:
            print(epoch, x.tolist(), y.tolist(), x.dtype, y.dtype)


if __name__ == "__main__":
    main()
