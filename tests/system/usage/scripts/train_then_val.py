"""Two loaders in one script: each epoch trains on one, then validates on the other."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    train = TensorDataset(torch.arange(24).float(), torch.arange(24) % 3)
    val = TensorDataset(torch.arange(100, 112).float(), torch.arange(12) % 3)
    train_loader = Loader(train, batch_size=6, num_workers=2)
    val_loader = Loader(val, batch_size=4, num_workers=2)
    for epoch in range(2):
        for x, y in train_loader:
            print(epoch, "train", x.tolist(), y.tolist())
        for x, y in val_loader:
            print(epoch, "val", x.tolist(), y.tolist())


if __name__ == "__main__":
    main()
