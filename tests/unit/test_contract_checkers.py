"""Each checker of tests/helpers/contracts.py fed a run that breaks its contract: the
checkers that tests/helpers/contract_matrix.py runs over every source and placement can fail."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from asyncloader import AsyncLoader
from tests.helpers import Draws, SyncSource
from tests.helpers.contracts import (
    check_bounded_window,
    check_clean_shutdown,
    check_exactly_once,
    check_order,
    check_repeatable,
    check_resume,
)

N, BATCH = 42, 4


def test_order_checker_rejects_a_swap_and_a_missing_tail():
    """check_order fails when two samples are swapped or the last one is missing."""
    check_order([[0, 1], [2, 3]], range(4))
    with pytest.raises(AssertionError, match="order broken at sample 1"):
        check_order([[0, 2], [1, 3]], range(4))
    with pytest.raises(AssertionError, match="order broken at sample 3"):
        check_order([[0, 1], [2]], range(4))


def test_exactly_once_checker_rejects_a_duplicate_and_a_loss():
    """check_exactly_once fails on a sample delivered twice and on one never delivered."""
    check_exactly_once([[3, 1], [0, 2]], range(4))
    with pytest.raises(AssertionError, match=r"more often than expected \[1\]"):
        check_exactly_once([[0, 1], [1, 2, 3]], range(4))
    with pytest.raises(AssertionError, match=r"missing \[2\]"):
        check_exactly_once([[0, 1], [3]], range(4))


def test_window_checker_rejects_overshoot_and_an_unexercised_bound():
    """check_bounded_window fails past either bound, and when nothing ran ahead."""
    ok = dict(window=4, max_ahead=4, io_concurrency=8, max_fetching=8)
    check_bounded_window(SimpleNamespace(**ok))
    for wrong in (dict(max_ahead=5), dict(max_fetching=9), dict(max_ahead=1)):
        with pytest.raises(AssertionError):
            check_bounded_window(SimpleNamespace(**ok | wrong))


class Leaky:
    """A stand-in loader whose epoch starts a thread named like the loader's and leaves it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.release.wait, name="asyncloader-leak")

    def __iter__(self):
        self.thread.start()
        yield [0]


def test_shutdown_checker_rejects_a_thread_left_running():
    """check_clean_shutdown fails when a thread the epoch started is still alive."""
    leaky = Leaky()
    try:
        with pytest.raises(AssertionError, match=r"threads left after break: \['asyncloader-leak'"):
            check_clean_shutdown(leaky, "break")
    finally:
        leaky.release.set()
        leaky.thread.join()


class Forgetful(AsyncLoader):
    """A loader that ignores the state it is given: it restarts the epoch."""

    def load_state_dict(self, state: dict) -> None:
        pass


def test_repeatable_checker_rejects_draws_that_change():
    """Draws made in this process (num_workers ignored, no per-batch seeds) change from run to
    run: the checker says so."""
    make = lambda num_workers, seed: AsyncLoader(  # noqa: E731
        SyncSource(N), batch_size=BATCH, transform=Draws(), collate_fn=list,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    with pytest.raises(AssertionError, match="drew differently"):
        check_repeatable(make, lambda batch: [(int(s[0]), d) for s, d in batch])


def test_resume_checker_rejects_a_loader_that_restarts():
    """check_resume fails when the resumed loader replays batches already delivered."""
    make = lambda cls=AsyncLoader: cls(SyncSource(12), batch_size=4)  # noqa: E731
    check_resume(make, [0, 1, 3])
    with pytest.raises(AssertionError, match="resumed after 1: the batches after differ"):
        check_resume(lambda: make(Forgetful), [0, 1])
    with pytest.raises(AssertionError, match="more often than expected"):
        check_resume(lambda: make(Forgetful), [1], in_order=False)
