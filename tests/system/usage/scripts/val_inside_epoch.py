"""Validation inside the training epoch: the whole val loader every 3 training steps."""

import os

import torch
from torch.utils.data import TensorDataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


def main():
    train_loader = Loader(TensorDataset(torch.arange(32)), batch_size=4, num_workers=2)
    val_loader = Loader(TensorDataset(torch.arange(-10, 0)), batch_size=4, num_workers=2)
    for epoch in range(2):
        for step, (x,) in enumerate(train_loader):
            print(epoch, step, x.tolist())
            if step % 3 == 2:
                total = sum(v.sum().item() for (v,) in val_loader)
                print(epoch, step, "val", total)


if __name__ == "__main__":
    main()
