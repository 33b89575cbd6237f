"""Threads of the script's own, started before the loaders: a monitor that wakes every few
milliseconds, and an event writer fed through a queue, like TensorBoard's SummaryWriter."""

import os
import queue
import tempfile
import threading

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class EventWriter:
    """Writes scalars to a file from a thread of its own, as SummaryWriter does."""

    def __init__(self, path):
        self.queue = queue.Queue()
        self.file = open(path, "w")  # noqa: SIM115 - closed in close()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add_scalar(self, tag, value, step):
        self.queue.put(f"{tag} {step} {value}\n")

    def _run(self):
        while (line := self.queue.get()) is not None:
            self.file.write(line)
            self.file.flush()

    def close(self):
        self.queue.put(None)
        self.thread.join()
        self.file.close()


class Monitor(threading.Thread):
    """Samples something every 5 ms until stopped, as a GPU or memory monitor does."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.samples = 0

    def run(self):
        while not self.stop.wait(0.005):
            with self.lock:
                self.samples += 1


class Squares(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events")
        writer = EventWriter(path)
        monitor = Monitor()
        monitor.start()
        loader = Loader(Squares(), batch_size=4, num_workers=2)
        step = 0
        for epoch in range(2):
            for batch in loader:
                print(epoch, batch.tolist())
                writer.add_scalar("sum", batch.sum().item(), step)
                step += 1
        monitor.stop.set()
        monitor.join()
        writer.close()
        with open(path) as f:
            print(f.read(), end="")


if __name__ == "__main__":
    main()
