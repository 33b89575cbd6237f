"""The progress record: one lock between the consumer's thread and the source's puller."""

import threading

from asyncloader._checkpoint.progress import Cursor, Progress
from asyncloader._checkpoint.record import Resume


def test_cursor_counts_in_order_and_beyond():
    """Delivered seqs below ``next`` are folded in; the rest wait in ``beyond``."""
    cursor = Cursor()
    for seq in (1, 3, 0):
        cursor.add(seq)
    assert (cursor.next, cursor.beyond) == (2, {3})


def test_checkpoint_names_the_source_state_before_the_next_batch():
    """The checkpoint holds the source's state before the first batch not yet delivered."""
    progress = Progress(Resume(), source_state=(0, "s0"))
    progress.source_state_before(1, "s1")
    progress.source_state_before(2, "s2")
    progress.delivered(0)
    assert progress.checkpoint() == {"next_batch": 1, "delivered_beyond": [], "source_state": "s1"}


def test_concurrent_writers_never_lose_the_state_a_checkpoint_needs():
    """A puller thread records states while the consumer delivers and checkpoints: every
    checkpoint names the state recorded for its ``next_batch``, and pruning keeps the record
    as small as the batches ahead of the consumer."""
    n = 3000
    progress = Progress(Resume(), source_state=(0, 0))
    recorded = threading.Semaphore(0)

    def puller() -> None:
        for seq in range(1, n + 1):
            progress.source_state_before(seq, seq)
            recorded.release()

    thread = threading.Thread(target=puller)
    thread.start()
    for seq in range(n):
        recorded.acquire()  # batch seq was pulled (its successor's state recorded)
        progress.delivered(seq)
        point = progress.checkpoint()
        assert point["source_state"] == point["next_batch"] == seq + 1
    thread.join()
    assert progress.batches == n
    assert len(progress._states) == 1


def test_a_source_without_state_is_not_tracked():
    """Only a source that keeps state is asked for it; its checkpoints carry None."""
    progress = Progress(Resume(start=4, skip=frozenset({6})))
    progress.source_state_before(5, "ignored")
    progress.delivered(4)
    progress.delivered(5)
    assert not progress.tracks_source
    assert progress.checkpoint() == {"next_batch": 7, "delivered_beyond": [], "source_state": None}
