"""What every benchmark sample contains, and the check that a run delivered exactly those.

A sample is a ``uint8`` array whose first 4 bytes hold its index (little-endian) and whose
other bytes all equal ``index % 251``; the ``overhead`` workload's samples are the bare index.
:class:`Checker` reads each delivered batch, whatever its order, and :meth:`Checker.verify`
fails loudly unless every index ``0..n-1`` came exactly once with the right content. The
content sum reads every ``STRIDE``-th byte, so checking costs the consumer little next to the
batch it checks, yet a sample from the wrong index, a zeroed or a torn buffer is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

HEADER = 4
STRIDE = 97
MODULUS = 251


class DeliveryError(AssertionError):
    """A run delivered the wrong samples: missing, duplicated, foreign or corrupted."""


def make_sample(index: int, shape: tuple[int, ...]) -> np.ndarray:
    """The sample ``index``: ``uint8`` of ``shape``, index in the first 4 bytes, then a fill."""
    out = np.full(shape, index % MODULUS, dtype=np.uint8)
    flat = out.reshape(-1)
    flat[:HEADER] = np.frombuffer(int(index).to_bytes(HEADER, "little"), dtype=np.uint8)
    return out


def _checked_positions(nbytes: int) -> int:
    """How many bytes of one sample the content sum reads."""
    return len(range(HEADER, nbytes, STRIDE))


def _as_tensor(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch)
    raise DeliveryError(f"a batch must be a tensor, got {type(batch).__qualname__}")


class Checker:
    """Accumulates what batches delivered; :meth:`verify` compares it with samples ``0..n-1``.

    Args:
        n: Samples the run must deliver.
        shape: Shape of one sample, or ``()`` when samples are bare integer indices.
    """

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        self.n = n
        self.shape = tuple(shape)
        self.count = 0
        self.content = 0
        self._seen = np.zeros(n, dtype=np.int64)
        self._foreign = 0

    def add(self, batch: Any) -> int:
        """Records one batch; returns how many samples it held."""
        t = _as_tensor(batch)
        if tuple(t.shape[1:]) != self.shape:
            raise DeliveryError(f"batch of shape {tuple(t.shape)}, samples must be {self.shape}")
        if self.shape == ():
            indices = t.to(torch.int64)
        else:
            if t.dtype != torch.uint8:
                raise DeliveryError(f"batch of dtype {t.dtype}, samples must be torch.uint8")
            rows = t.reshape(t.shape[0], -1)
            head = rows[:, :HEADER].to(torch.int64)
            indices = head[:, 0] | head[:, 1] << 8 | head[:, 2] << 16 | head[:, 3] << 24
            self.content += int(rows[:, HEADER::STRIDE].sum(dtype=torch.int64))
        idx = indices.numpy()
        inside = (idx >= 0) & (idx < self.n)
        self._foreign += int((~inside).sum())
        np.add.at(self._seen, idx[inside], 1)
        self.count += len(idx)
        return len(idx)

    def expected_content(self) -> int:
        """The content sum that samples ``0..n-1`` give."""
        if self.shape == ():
            return 0
        per_sample = _checked_positions(int(np.prod(self.shape)))
        fills = np.arange(self.n, dtype=np.int64) % MODULUS
        return int(fills.sum()) * per_sample

    def verify(self) -> None:
        """Raises DeliveryError unless every sample came exactly once with its content."""
        problems = []
        if self.count != self.n:
            problems.append(f"delivered {self.count} samples, expected {self.n}")
        if self._foreign:
            problems.append(f"{self._foreign} samples with indices outside 0..{self.n - 1}")
        missing = int((self._seen == 0).sum())
        repeated = int((self._seen > 1).sum())
        if missing:
            problems.append(f"{missing} indices never delivered")
        if repeated:
            problems.append(f"{repeated} indices delivered more than once")
        if self.content != self.expected_content():
            problems.append(
                f"content checksum {self.content} != expected {self.expected_content()}"
            )
        if problems:
            raise DeliveryError("; ".join(problems))

    def summary(self) -> dict[str, int]:
        """What the run's JSON records of the check."""
        return {"count": self.count, "content_checksum": self.content}
