"""Where workers start by pickling (spawn, forkserver), what they cannot receive is refused at
iter() with a TypeError that names the argument, the attribute path, the type and the fix,
before any process starts; never a WorkerCrashedError."""

import threading

import psutil
import pytest

from asyncloader import AsyncLoader
from asyncloader._engines.picklable import check_picklable
from tests.helpers import SyncSource, indices_of
from tests.helpers.paths import REPO

ROOT = REPO


class HoldsHandle:
    """A map-style dataset holding an open file, as h5py or lmdb datasets do."""

    def __init__(self, path):
        self.meta = {"files": [open(path, "rb")]}  # noqa: SIM115 (closed by the test)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i


class Slotted:
    __slots__ = ("lock",)

    def __init__(self):
        self.lock = threading.Lock()


class DropsHandle(HoldsHandle):
    """The documented fix: the handle is left out of the pickled state."""

    def __getstate__(self):
        return {}


def children():
    return psutil.Process().children(recursive=True)


@pytest.fixture
def handle_file(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(64))
    return path


@pytest.mark.parametrize("mp_context", ["spawn", "forkserver"])
def test_a_dataset_holding_a_handle_is_refused_naming_its_path(handle_file, mp_context):
    """dataset.meta['files'][0]: _io.BufferedReader is named, with the fix, before any worker
    process exists."""
    dataset = HoldsHandle(handle_file)
    before = {p.pid for p in children()}
    try:
        loader = AsyncLoader(dataset, batch_size=2, num_workers=2, mp_context=mp_context)
        with pytest.raises(TypeError) as caught:
            iter(loader)
    finally:
        dataset.meta["files"][0].close()
    message = str(caught.value)
    assert f"the workers start with {mp_context!r}" in message
    assert "dataset.meta['files'][0]: _io.BufferedReader" in message
    assert "worker_init_fn" in message and "__getstate__" in message
    assert 'mp_context="fork"' in message
    helpers = ("forkserver", "resource_tracker")  # started with the loader, not workers
    new = [p for p in children() if p.pid not in before]
    assert [p for p in new if not any(h in " ".join(p.cmdline()) for h in helpers)] == []


def test_a_lambda_collate_is_refused_naming_the_argument():
    """collate_fn=lambda under spawn: the message names collate_fn and says to define it at
    module level."""

    def local_transform(x):
        return x

    with pytest.raises(TypeError, match=r"collate_fn: .*<lambda>.*top level of a module"):
        iter(AsyncLoader(SyncSource(8), batch_size=2, num_workers=1, mp_context="spawn",
                         collate_fn=lambda b: b))  # fmt: skip
    with pytest.raises(TypeError, match=r"transform: .*local_transform.*top level"):
        iter(AsyncLoader(SyncSource(8), batch_size=2, num_workers=1, mp_context="spawn",
                         transform=local_transform, fetch_in_workers=True))  # fmt: skip


def test_paths_through_slots_and_nesting():
    """The walk follows pickle's own reduction: __slots__, dicts, lists."""
    with pytest.raises(TypeError, match=r"dataset\[1\]\['x'\]\.lock: _thread\.lock"):
        check_picklable({"dataset": [1, {"x": Slotted()}]}, "spawn")


MAIN_WITHOUT_FILE = """
from torch.utils.data import Dataset
from asyncloader import AsyncLoader

class Squares(Dataset):
    def __len__(self): return 8
    def __getitem__(self, i): return i * i

for mp in ({mp!r},):
    try:
        print([b.tolist() for b in AsyncLoader(Squares(), batch_size=4, num_workers=2,
                                               mp_context=mp)])
    except TypeError as exc:
        print("TypeError:", exc)
"""


def test_a_second_epoch_with_a_lambda_and_a_live_thread_forks():
    """The plainest loop: a lambda collate_fn, another thread alive, three epochs; every
    epoch forks (nothing is pickled), as DataLoader's."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="someone-elses-thread")
    other.start()
    try:
        loader = AsyncLoader(SyncSource(12), batch_size=4, num_workers=2, collate_fn=lambda b: b)
        for _ in range(3):
            assert indices_of(loader) == list(range(12))
        loader.close()
    finally:
        stop.set()
        other.join()
