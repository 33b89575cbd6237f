"""Forked workers never collect the training process's objects: a finalizer of the parent's
garbage run in a child acts on state the two share (an epoll instance, a socket) and breaks
the parent. Found with ``datasets`` streaming over HTTP under 2 workers: a worker collected
fsspec's connections and unregistered them from the training process's event loop, which
then waited for ever."""

from __future__ import annotations

import gc
import os

import pytest

from asyncloader import AsyncLoader
from tests.helpers.columnar import parquet_set
from tests.servers import FaultyHTTPServer


class Finalized:
    """A cycle whose finalizer appends the collecting process's pid to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.me = self

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def collect(worker_id: int) -> None:
    gc.collect()


@pytest.mark.parametrize("fetch_in_workers", [False, True], ids=["workers", "fetch-in-workers"])
def test_the_parents_garbage_is_finalized_in_the_parent_only(tmp_path, fetch_in_workers):
    """A garbage cycle left uncollected at the fork: the workers' own collections (forced
    in worker_init_fn) leave it alone; the parent finalizes it, once."""
    path = str(tmp_path / "finalized")
    enabled = gc.isenabled()
    gc.disable()
    try:
        Finalized(path)  # garbage at once, collected by nobody until gc runs
        loader = AsyncLoader(
            range(16),
            batch_size=4,
            num_workers=2,
            fetch_in_workers=fetch_in_workers,
            worker_init_fn=collect,
        )
        assert [int(i) for b in loader for i in b] == list(range(16))
    finally:
        if enabled:
            gc.enable()
    gc.collect()
    with open(path) as f:
        assert f.read().split() == [str(os.getpid())]


def test_datasets_streaming_over_http_with_two_workers():
    """The case that hung: ``datasets`` streaming Parquet over HTTP, pulled in the training
    process (fsspec's event loop there) while the workers collate, workers collecting."""
    datasets = pytest.importorskip("datasets")
    files = parquet_set([300, 300, 300], 100)
    with FaultyHTTPServer(files) as server:
        urls = [server.url(name) for name in files]
        stream = datasets.load_dataset("parquet", data_files=urls, split="train", streaming=True)
        opts = dict(batch_size=32, num_workers=2, collate_fn=list, worker_init_fn=collect)
        loader = AsyncLoader(stream, **opts, timeout=60)
        assert sorted(row["id"] for batch in loader for row in batch) == list(range(900))


def test_objects_the_program_froze_stay_frozen(tmp_path):
    """A program that froze objects itself (for copy-on-write) keeps them frozen after the
    workers start, and its garbage is still finalized in the parent only."""
    path = str(tmp_path / "finalized")
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        Finalized(path)
        loader = AsyncLoader(range(8), batch_size=4, num_workers=2, worker_init_fn=collect)
        assert [int(i) for b in loader for i in b] == list(range(8))
        # Some frozen objects die meanwhile (reference counts); unfreezing would leave none.
        assert gc.get_freeze_count() > frozen // 2, "the program's frozen objects were unfrozen"
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    gc.collect()
    with open(path) as f:
        assert f.read().split() == [str(os.getpid())]
