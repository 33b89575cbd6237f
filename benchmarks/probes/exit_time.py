"""The dataset of the since-retired ``exit_time`` probe (last at commit 9efcad8; its numbers
are in docs/benchmarks.md). It stays because ``tests/hygiene_scripts/raise_in_loop.py``
imports it to run the case the probe measured."""

from __future__ import annotations

import time

import torch


class Slow(torch.utils.data.Dataset):
    """A million samples of 10 ms each: the epoch is far from over at the raise or the kill."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> int:
        time.sleep(0.01)
        return index
