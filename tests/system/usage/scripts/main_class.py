"""A Dataset class defined in __main__ of a script given as `python -` (on stdin) or as
`python -c`: top-level code, num_workers=2."""

import os

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Cubes(Dataset):
    def __len__(self):
        return 18

    def __getitem__(self, i):
        return {"i": i, "cube": torch.tensor(i**3)}


loader = Loader(Cubes(), batch_size=5, num_workers=2)
for epoch in range(2):
    for batch in loader:
        print(epoch, batch["i"].tolist(), batch["cube"].tolist())
