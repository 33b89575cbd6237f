"""A dataset holding a file opened in __init__, read with os.pread in __getitem__."""

import os
import struct
import tempfile

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader

RECORD = struct.Struct("<qd")


class Records(Dataset):
    def __init__(self, path):
        self.file = open(path, "rb")  # noqa: SIM115 - held for the dataset's life
        self.n = os.fstat(self.file.fileno()).st_size // RECORD.size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        key, value = RECORD.unpack(os.pread(self.file.fileno(), RECORD.size, i * RECORD.size))
        return torch.tensor(key), torch.tensor(value)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "records.bin")
        with open(path, "wb") as f:
            for i in range(30):
                f.write(RECORD.pack(i * 7, i / 4))
        loader = Loader(Records(path), batch_size=4, num_workers=2)
        for epoch in range(2):
            for keys, values in loader:
                print(epoch, keys.tolist(), values.tolist())


if __name__ == "__main__":
    main()
