"""The user's own batch_sampler: batches of similar lengths (bucketing), of varying sizes,
padded by a collate_fn."""

import os

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, Sampler

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Sentences(Dataset):
    def __init__(self):
        self.lengths = [(i * 7) % 9 + 1 for i in range(25)]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.arange(self.lengths[i]) + i


class BucketBatchSampler(Sampler):
    """Batches of at most `tokens` tokens, from indices sorted by length."""

    def __init__(self, lengths, tokens):
        self.lengths = lengths
        self.tokens = tokens

    def __iter__(self):
        batch, longest = [], 0
        for i in sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], i)):
            longest = max(longest, self.lengths[i])
            if batch and longest * (len(batch) + 1) > self.tokens:
                yield batch
                batch, longest = [], self.lengths[i]
            batch.append(i)
        if batch:
            yield batch

    def __len__(self):
        return sum(1 for _ in self)


def pad(batch):
    return pad_sequence(batch, batch_first=True, padding_value=-1)


def main():
    dataset = Sentences()
    batches = BucketBatchSampler(dataset.lengths, tokens=20)
    loader = Loader(dataset, batch_sampler=batches, num_workers=2, collate_fn=pad)
    print("batches", len(loader))
    for epoch in range(2):
        for batch in loader:
            print(epoch, batch.tolist())


if __name__ == "__main__":
    main()
