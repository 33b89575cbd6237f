"""Worker processes keep one batch's freed sample memory for the next batch."""

import gc
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader._worker.allocator import empty_huge
from tests.helpers.paths import REPO

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's (mallopt)"
)

SAMPLES = 64
SAMPLE_BYTES = 150 * 1024  # a 3x224x224 uint8 image: above glibc's default mmap threshold
PAGES = SAMPLES * SAMPLE_BYTES // 4096


def refaulted_pages() -> int:
    """Makes and frees two batches of image-sized arrays (by the second, glibc's dynamic mmap
    threshold has risen and the samples are on the heap), then counts the page faults of a
    third: about PAGES when freed memory went back to the kernel, near 0 if it was kept."""
    import resource

    import numpy as np

    def batch() -> None:
        samples = [np.full(SAMPLE_BYTES, i, dtype=np.uint8) for i in range(SAMPLES)]
        del samples

    batch()
    batch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def faults_in_fresh_process(keep: bool) -> int:
    """refaulted_pages() in a new interpreter (mallopt changes the whole process)."""
    code = textwrap.dedent(
        f"""
        from asyncloader._worker.allocator import keep_freed_memory
        from tests.integration.worker.test_malloc import refaulted_pages
        if {keep}:
            assert keep_freed_memory()
        print(refaulted_pages())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPO,
    )
    return int(out.stdout)


class FaultCounter:
    """Each sample is the page-fault count of a batch made after two were freed."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return refaulted_pages()


def test_asyncloader_workers_keep_freed_memory():
    """The loader's own worker processes run with the thresholds set."""
    with AsyncLoader(FaultCounter(), batch_size=None, num_workers=1) as loader:
        counts = [int(c) for c in loader]
    assert len(counts) == 2
    assert max(counts) < PAGES // 4, counts


def test_empty_huge_is_a_writable_tensor_that_keeps_its_mapping():
    big = empty_huge((3, 1024, 1024), torch.float32)  # 12 MiB: its own mapping
    assert big.shape == (3, 1024, 1024) and big.dtype == torch.float32
    big.fill_(2.5)
    other = empty_huge((3, 1024, 1024), torch.float32)
    other.zero_()
    gc.collect()
    assert float(big.sum()) == 2.5 * big.numel()  # not shared with the second one
    view = big[1]
    del big
    gc.collect()
    assert float(view.sum()) == 2.5 * view.numel()  # the mapping lives as long as a view
    small = empty_huge((4,), torch.uint8)  # below HUGE_BYTES: torch.empty
    assert small.shape == (4,) and small.dtype == torch.uint8
