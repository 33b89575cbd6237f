"""A dataset returning dicts of tensors, numbers and strings."""

import os

import torch
from torch.utils.data import Dataset

if os.environ.get("LOADER") == "async":
    from asyncloader import AsyncLoader as Loader
else:
    from torch.utils.data import DataLoader as Loader


class Records(Dataset):
    def __len__(self):
        return 14

    def __getitem__(self, i):
        return {
            "image": torch.full((2, 2), float(i)),
            "label": i % 4,
            "name": f"img_{i:03d}.jpg",
            "meta": {"width": 10 + i, "scale": i / 2},
        }


def main():
    loader = Loader(Records(), batch_size=4, num_workers=2)
    for epoch in range(2):
        for batch in loader:
            print(
                epoch,
                sorted(batch),
                batch["image"].tolist(),
                batch["label"].tolist(),
                batch["name"],
                batch["meta"]["width"].tolist(),
                batch["meta"]["scale"].tolist(),
                batch["meta"]["scale"].dtype,
            )


if __name__ == "__main__":
    main()
