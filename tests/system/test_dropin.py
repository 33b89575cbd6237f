"""DataLoader's ``iterator._workers`` in every placement, the fork server's included
(the rest of the drop-in contract: tests/integration/test_dropin.py)."""

from __future__ import annotations

import pytest

from asyncloader import AsyncLoader
from tests.helpers import SyncSource


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(fetch_in_workers=True),
        dict(fetch_in_workers=True, mp_context="forkserver"),
        dict(persistent_workers=True),
    ],
    ids=str,
)
def test_an_iterators_workers_are_its_epochs_worker_processes(kw):
    """DataLoader's ``iterator._workers``, which code written for DataLoader reads: the
    epoch's worker processes, alive once it is read (it waits for them to start) and exited
    with code 0 once the loader is closed."""
    loader = AsyncLoader(SyncSource(16), batch_size=2, num_workers=2, **kw)
    it = iter(loader)
    workers = it._workers
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    assert len(list(it)) == 8
    loader.close()
    for w in workers:
        w.join(10)
        assert not w.is_alive() and w.exitcode == 0
