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
"""

from __future__ import annotations

import ctypes
import platform

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
