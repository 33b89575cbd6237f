"""A dataset returning strings (text lines) and (text, label) pairs."""

import os

from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again", "and"]


class Lines(Dataset):
    def __len__(self):
        return len(WORDS)

    def __getitem__(self, i):
        return WORDS[i]


class Labelled(Lines):
    def __getitem__(self, i):
        return WORDS[i].upper(), len(WORDS[i])


def main():
    for epoch in range(2):
        for batch in Loader(Lines(), batch_size=3, num_workers=2):
            print(epoch, type(batch).__name__, batch)
        for text, length in Loader(Labelled(), batch_size=5, num_workers=2):
            print(epoch, text, length.tolist())


if __name__ == "__main__":
    main()
