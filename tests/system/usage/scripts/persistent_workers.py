"""persistent_workers=True over 3 epochs: the same worker processes serve every epoch."""

import os

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class WithPid(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor(i * 3), os.getpid()


def main():
    loader = Loader(WithPid(), batch_size=4, num_workers=2, persistent_workers=True)
    pids = set()
    for epoch in range(3):
        for x, pid in loader:
            print(epoch, x.tolist())
            pids.update(pid.tolist())
    print("worker processes, at most 2:", len(pids) <= 2 and os.getpid() not in pids)


if __name__ == "__main__":
    main()
