"""A dataset returning namedtuples: batches are the same namedtuple type, field by field."""

import os
from collections import namedtuple

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader

Sample = namedtuple("Sample", ["features", "target", "weight"])


class Table(Dataset):
    def __len__(self):
        return 15

    def __getitem__(self, i):
        return Sample(torch.tensor([i, -i]), i % 2, float(i) / 3)


def main():
    loader = Loader(Table(), batch_size=4, num_workers=2)
    for epoch in range(2):
        for batch in loader:
            print(
                epoch,
                type(batch).__name__,
                batch._fields,
                batch.features.tolist(),
                batch.target.tolist(),
                batch.weight.tolist(),
            )


if __name__ == "__main__":
    main()
