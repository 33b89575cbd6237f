"""The h5py pattern: worker_init_fn opens the file in each worker (through
get_worker_info().dataset) and __getitem__ reads from that handle."""

import os
import tempfile

import torch
from torch.utils.data import Dataset, get_worker_info

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader

ROW = 16


class Rows(Dataset):
    def __init__(self, path):
        self.path = path
        self.file = None  # opened in each worker
        self.n = os.path.getsize(path) // ROW

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.file.seek(i * ROW)
        return torch.frombuffer(bytearray(self.file.read(ROW)), dtype=torch.uint8)


def open_file(worker_id):
    dataset = get_worker_info().dataset
    dataset.file = open(dataset.path, "rb")  # noqa: SIM115 - the worker's for its life


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            f.write(bytes(i % 251 for i in range(ROW * 22)))
        loader = Loader(Rows(path), batch_size=4, num_workers=2, worker_init_fn=open_file)
        for epoch in range(2):
            for batch in loader:
                print(epoch, batch.sum(dim=1).tolist(), batch[:, :3].tolist())


if __name__ == "__main__":
    main()
