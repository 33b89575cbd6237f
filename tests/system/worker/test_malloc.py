"""Freed memory kept for the next batch, measured in a fresh interpreter's page faults
(the allocator's settings in the workers: tests/integration/worker/test_malloc.py)."""

from tests.integration.worker.test_malloc import PAGES, faults_in_fresh_process


def test_keep_freed_memory_stops_the_next_batch_faulting_its_pages_in_again():
    """Without it, glibc returns a freed batch of 150 KiB samples to the kernel; with it, the
    next batch reuses those pages."""
    assert faults_in_fresh_process(keep=False) > PAGES // 2
    assert faults_in_fresh_process(keep=True) < PAGES // 4
