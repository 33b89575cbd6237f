"""A closure as collate_fn and a local function as worker_init_fn, both defined in main()."""

import os

import torch
from torch.utils.data import Dataset, get_worker_info

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Sequences(Dataset):
    scale = 1

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.arange(1, i % 5 + 2) * self.scale


def main():
    pad_to = 6
    scale = 10

    def init_worker(worker_id):
        get_worker_info().dataset.scale = scale

    def pad(batch):
        out = torch.zeros(len(batch), pad_to, dtype=torch.long)
        for row, seq in zip(out, batch, strict=True):
            row[: len(seq)] = seq
        return out

    loader = Loader(
        Sequences(), batch_size=4, num_workers=2, collate_fn=pad, worker_init_fn=init_worker
    )
    for epoch in range(3):
        for batch in loader:
            print(epoch, batch.tolist())


if __name__ == "__main__":
    main()
