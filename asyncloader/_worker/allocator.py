"""How a worker process's allocator treats the memory of one batch's samples.

A dataset that decodes images makes samples of a few hundred KiB each, all freed together once
the batch is collated. glibc's malloc then hands those pages back to the kernel (they sit at the
top of the heap, more than its trim threshold of twice the largest sample), and the next batch
faults every page in again, zero-filled: measured on the benchmark's ``big`` workload (64
samples of 150 KiB per batch), 4,500 page faults per batch instead of 2,400, and 60% more CPU
in each worker.

:func:`keep_freed_memory` raises the two thresholds to the highest values glibc's own dynamic
rule can reach (32 MiB for ``mmap``, twice that for trimming), fixed from the start instead of
learnt one sample size at a time: a worker keeps up to 64 MiB of freed memory for its next
batch. It is called in asyncloader's own worker processes only, never in the user's process.

:func:`empty_huge` gives a large tensor that is made fresh per batch its own mapping in huge
pages, so that filling it does not fault in 4 KiB at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import platform

import torch

M_TRIM_THRESHOLD = -1  # mallopt() parameters, from glibc's <malloc.h>
M_MMAP_THRESHOLD = -3

#: Allocations below this come from the heap, not a fresh mapping each: glibc's
#: ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit, the ceiling of its dynamic threshold.
MMAP_THRESHOLD = 32 << 20
#: Free memory kept at the top of the heap before it is returned to the kernel: twice the mmap
#: threshold, as glibc's dynamic rule sets it.
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


def keep_freed_memory() -> bool:
    """Makes this process's glibc malloc keep one batch's freed samples for the next.

    Returns:
        Whether the thresholds were set: ``False`` off glibc (macOS, musl), where nothing
        changes.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the symbols already loaded, glibc's among them
    # mallopt returns 1 on success. Setting either threshold turns glibc's dynamic one off,
    # so both are set.
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


#: Tensors at least this large are worth a mapping of their own advised for huge pages.
HUGE_BYTES = 4 << 20


def empty_huge(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in a private anonymous mapping advised for transparent huge
    pages (``MADV_HUGEPAGE``), where the platform has them and it is at least
    :data:`HUGE_BYTES`; else ``torch.empty``.

    A tensor of tens of MiB made fresh per batch (a normalised image batch: 38 MiB at 64 x 3 x
    224 x 224 float32) is above malloc's mmap threshold, so each one is a new mapping whose
    pages fault in one 4 KiB page at a time, zero-filled: on the benchmark machine filling
    it took 34 ms this way and 8 ms in 2 MiB pages, no more than refilling memory already
    mapped. Where THP is ``never`` the advice is ignored and this costs what ``torch.empty``
    does. The mapping lives as long as the tensor.
    """
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    private = getattr(mmap, "MAP_PRIVATE", None)
    if nbytes < HUGE_BYTES or advise is None or private is None:
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes, flags=private | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # advice only
        mapping.madvise(advise)
    return torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape)
