"""The user's own Sampler: even indices first, then odd ones, reversed on odd epochs."""

import os

import torch
from torch.utils.data import Dataset, Sampler

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Tenfold(Dataset):
    def __len__(self):
        return 21

    def __getitem__(self, i):
        return torch.tensor(i * 10)


class EvensThenOdds(Sampler):
    def __init__(self, n):
        self.n = n
        self.epoch = 0

    def __len__(self):
        return self.n

    def __iter__(self):
        order = list(range(0, self.n, 2)) + list(range(1, self.n, 2))
        if self.epoch % 2:
            order.reverse()
        return iter(order)


def main():
    sampler = EvensThenOdds(21)
    loader = Loader(Tenfold(), batch_size=4, sampler=sampler, num_workers=2)
    for epoch in range(3):
        sampler.epoch = epoch
        for batch in loader:
            print(epoch, batch.tolist())


if __name__ == "__main__":
    main()
