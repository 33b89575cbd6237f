"""A plain training loop in top-level code: a lambda collate_fn, 3 epochs, num_workers=2."""

import os

import torch
from torch import nn
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Points(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 3, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


torch.manual_seed(0)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = Loader(
    Points(32),
    batch_size=8,
    num_workers=2,
    collate_fn=lambda batch: (
        torch.stack([x for x, _ in batch]),
        torch.stack([y for _, y in batch]),
    ),
)
for epoch in range(3):
    total = 0.0
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        opt.step()
        total += loss.item()
    print(f"epoch {epoch} loss {total:.6f}")
print("weights", [round(w, 6) for w in model.weight.flatten().tolist()])
