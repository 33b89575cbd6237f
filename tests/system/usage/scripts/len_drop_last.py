"""A progress display reading len(loader), with drop_last=True, and enumerate()."""

import os

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Halves(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        return torch.tensor(i / 2)


def main():
    loader = Loader(Halves(), batch_size=5, num_workers=2, drop_last=True)
    for epoch in range(2):
        for step, batch in enumerate(loader, start=1):
            print(f"epoch {epoch} [{step}/{len(loader)}]", batch.tolist())


if __name__ == "__main__":
    main()
