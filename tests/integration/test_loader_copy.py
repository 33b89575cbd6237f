"""A loader can be pickled and deep-copied, as a DataLoader can (a trainer sending it to
spawned processes, a library copying it): the copy holds the configuration and the state
loaded into it, never the original's threads, workers or epochs."""

import copy
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils.data import DataLoader

from asyncloader import AsyncLoader
from tests.helpers import SyncSource, indices_of


def batches(loader):
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_a_fresh_loader_copies_and_yields_what_dataloader_yields(how):
    """pickle.dumps(AsyncLoader(list(range(10)), batch_size=2)) works, and the copy yields
    DataLoader's batches."""
    loader = AsyncLoader(list(range(10)), batch_size=2, shuffle=True,
                         generator=torch.Generator().manual_seed(5))  # fmt: skip
    twin = {
        "pickle": lambda: pickle.loads(pickle.dumps(loader)),
        "deepcopy": lambda: copy.deepcopy(loader),
        "copy": lambda: copy.copy(loader),
    }[how]()
    assert type(twin) is AsyncLoader and twin is not loader
    assert twin.batch_size == 2 and len(twin) == 5
    reference = DataLoader(list(range(10)), batch_size=2, shuffle=True,
                           generator=torch.Generator().manual_seed(5))  # fmt: skip
    assert batches(twin) == batches(reference)
    twin.close()


def test_a_used_loader_with_live_workers_copies_without_them():
    """After an epoch with persistent workers (and with one running), the copy shares no
    thread, pool or epoch with the original: both go on independently and both close."""
    loader = AsyncLoader(SyncSource(24), batch_size=4, num_workers=2, persistent_workers=True)
    assert indices_of(loader) == list(range(24))
    running = iter(loader)
    next(running)
    threads_before = threading.active_count()
    twin = pickle.loads(pickle.dumps(loader))
    assert threading.active_count() == threads_before  # nothing started by copying
    assert twin._workers is not loader._workers and twin._loop_thread is not loader._loop_thread
    assert indices_of(twin) == list(range(24))
    assert indices_of(loader) == list(range(24))
    twin.close()
    loader.close()


def test_the_copy_holds_the_loaded_state():
    """A state loaded with load_state_dict (and not yet used) travels with the copy: the
    copy resumes where the original would have."""
    source = AsyncLoader(SyncSource(20), batch_size=4, shuffle=True,
                         generator=torch.Generator().manual_seed(1))  # fmt: skip
    it = iter(source)
    seen = indices_of([next(it), next(it)])
    state = source.state_dict()
    rest = indices_of(it)
    fresh = AsyncLoader(SyncSource(20), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    fresh.load_state_dict(state)
    twin = copy.deepcopy(fresh)
    assert twin.state_dict() == fresh.state_dict()
    assert indices_of(twin) == rest and sorted(seen + rest) == list(range(20))


def test_a_user_executor_is_shared_by_a_deep_copy_and_refused_by_pickle():
    """A deep copy uses the same executor (a pool the user owns, not copied); pickling a
    loader that holds one fails plainly, as pickling the executor does."""
    with ThreadPoolExecutor(2) as pool:
        loader = AsyncLoader(SyncSource(8), batch_size=4, executor=pool)
        twin = copy.deepcopy(loader)
        assert twin._options.executor is pool
        assert twin._options.dataset is not loader._options.dataset
        assert indices_of(twin) == list(range(8))
        with pytest.raises(TypeError):
            pickle.dumps(loader)
