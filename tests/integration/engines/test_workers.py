"""Worker processes: shared-memory batches, shipping once, seeding, determinism, crashes."""

import gc
import os
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, default_collate

from asyncloader import AsyncLoader, WorkerCrashedError, get_worker_info
from asyncloader._worker.transport import to_shared
from tests.helpers import (
    AsyncSource,
    DieAt,
    NoisySource,
    RandomAugment,
    SyncSource,
    indices_of,
    worker_processes,
)
from tests.helpers.paths import REPO


def shm_files() -> set[str]:
    """/dev/shm entries of this process: those it maps, and torch segments named after it.

    /dev/shm is shared by every process on the machine, so a plain listing would also see
    other test runs' files. multiprocessing's own semaphores (``sem.*``) and heap arenas
    (``pym-*``), made once a process first starts a pool and kept for its life, are left out:
    a test run first in its process would otherwise see them appear.
    """
    with open("/proc/self/maps") as maps:
        mapped = {
            line.split()[5]
            for line in maps
            if "/dev/shm/" in line
            and not line.split()[5].startswith(("/dev/shm/sem.", "/dev/shm/pym-"))
        }
    named = {
        f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith(f"torch_{os.getpid()}_")
    }
    return mapped | named


def shm_mappings() -> int:
    """Shared-memory segments mapped into this process by torch (``torch_<pid>_...``; not
    libtorch_*.so, whose mappings the loader splits and merges as it changes their pages'
    protection)."""
    with open("/proc/self/maps") as maps:
        return sum("torch_" in line and ".so" not in line for line in maps)


@dataclass
class Record:
    image: np.ndarray
    label: int


def mixed_collate(samples):
    """A custom collate returning numpy arrays nested in every container kind."""
    ids = np.stack(samples)
    return {"ids": ids, "rec": Record(ids * 2, len(samples)), "pair": (ids[:, :1], [ids.sum()])}


def one_mib(x):
    """A transform making a 1 MiB sample, so batches of it go through shared memory."""
    return np.full(2**20, int(x[0]), dtype=np.uint8)


def test_small_batches_travel_by_value_and_large_ones_through_shared_memory():
    """Under 1 MiB a batch is pickled (cheaper than passing a segment); from 1 MiB it is shared."""
    small = list(AsyncLoader(SyncSource(16), batch_size=4, num_workers=2))
    assert [int(b[0, 0]) for b in small] == [0, 4, 8, 12]
    assert not any(b.is_shared() for b in small)
    large = list(AsyncLoader(SyncSource(6), batch_size=2, num_workers=2, transform=one_mib))
    assert [int(b[0, 0]) for b in large] == [0, 2, 4]
    assert all(b.is_shared() and b.shape == (2, 2**20) for b in large)


@pytest.mark.parametrize("transform", [None, one_mib], ids=["by-value", "shared"])
def test_numpy_arrays_in_any_container_come_back_as_numpy(transform):
    """Arrays nested in dicts, dataclasses, tuples and lists arrive as equal numpy arrays."""
    loader = AsyncLoader(
        SyncSource(16), batch_size=4, num_workers=2, collate_fn=mixed_collate, transform=transform
    )
    batches = list(loader)
    assert [int(b["ids"][0, 0]) for b in batches] == [0, 4, 8, 12]
    b = batches[1]
    assert isinstance(b["ids"], np.ndarray) and b["ids"].dtype == (
        np.int64 if transform is None else np.uint8
    )
    assert isinstance(b["rec"], Record) and b["rec"].label == 4
    assert np.array_equal(b["rec"].image, b["ids"] * 2)
    assert isinstance(b["pair"], tuple) and b["pair"][1][0] == b["ids"].sum()


def test_tensors_numpy_cannot_hold_still_arrive():
    """A small bfloat16 batch (no numpy dtype) takes the shared-memory path and arrives equal."""
    loader = AsyncLoader(SyncSource(8), batch_size=4, num_workers=2, collate_fn=to_bfloat16)
    batches = list(loader)
    assert [b.dtype for b in batches] == [torch.bfloat16] * 2
    assert batches[1][:, 0].tolist() == [4.0, 5.0, 6.0, 7.0]


def to_bfloat16(samples):
    return torch.tensor(np.stack(samples), dtype=torch.bfloat16)


def big(x):
    """A transform that turns a sample into a 200 MB array."""
    return np.full(200 * 2**20, int(x[0]) % 251, dtype=np.uint8)


def test_a_200_mb_batch_arrives_intact_and_its_memory_is_released():
    """200 MB batches cross intact; /dev/shm and this process's mappings return to baseline."""
    gc.collect()  # the baseline without earlier tests' garbage (their loaders' last batches)
    files, maps = shm_files(), shm_mappings()
    loader = AsyncLoader(SyncSource(3), batch_size=1, num_workers=2, transform=big, prefetch=1)
    batches = list(loader)
    assert [int(b[0, 0]) for b in batches] == [0, 1, 2]
    assert all(b.numel() == 200 * 2**20 and int(b[0, -1]) == i for i, b in enumerate(batches))
    assert shm_mappings() > maps, "the batches are views of shared memory"
    del batches
    gc.collect()
    assert shm_mappings() == maps
    assert shm_files() == files
    loader.close()
    assert shm_files() == files


def test_full_shared_memory_says_so_and_how_to_fix_it():
    """A sharing failure for lack of space becomes an OSError that names /dev/shm and a fix."""

    class Full(torch.Tensor):
        def share_memory_(self):
            raise RuntimeError(
                "unable to write to file </torch_1_2_3>: No space left on device (28)"
            )

    with pytest.raises(OSError, match=r"/dev/shm\) is too small .* --shm-size"):
        to_shared({"x": torch.zeros(2**18).as_subclass(Full)})  # 1 MiB: the shared path


class CountedPickles(SyncSource):
    """Counts how often it is pickled in this process."""

    pickled = 0

    def __getstate__(self):
        type(self).pickled += 1
        return self.__dict__


@pytest.mark.parametrize("persistent", [False, True])
def test_threads_alive_do_not_change_how_workers_start(persistent):
    """Another thread alive, and the loader's own loop thread from its first epoch: every
    epoch's workers are still forked (the dataset is never pickled), as DataLoader's."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="someone-elses-thread")
    other.start()
    try:
        CountedPickles.pickled = 0
        loader = AsyncLoader(
            CountedPickles(20), batch_size=2, num_workers=2, persistent_workers=persistent
        )
        for _ in range(3):
            assert indices_of(loader) == list(range(20))
        loader.close()
        assert CountedPickles.pickled == 0
    finally:
        stop.set()
        other.join()


def mark_worker(worker_id):
    os.environ["ASYNCLOADER_TEST_INIT"] = f"{worker_id}:{torch.initial_seed()}"


def report_worker(samples):
    info = get_worker_info()
    return [(info.id, info.seed, *os.environ["ASYNCLOADER_TEST_INIT"].split(":")) for _ in samples]


def test_workers_are_seeded_from_the_generator_then_call_worker_init_fn():
    """Worker i is seeded with base_seed + i (base drawn from generator), then init_fn(i) runs."""
    base = int(
        torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(7))
    )
    loader = AsyncLoader(
        SyncSource(40),
        batch_size=2,
        num_workers=2,
        collate_fn=report_worker,
        worker_init_fn=mark_worker,
        generator=torch.Generator().manual_seed(7),
    )
    rows = {row for batch in loader for row in batch}
    assert rows, "batches were produced"
    for worker_id, seed, marked, torch_seed in rows:
        assert seed == base + worker_id == int(torch_seed)
        assert marked == str(worker_id)


def epoch(source, num_workers, io_concurrency=64, seed=3):
    loader = AsyncLoader(
        source,
        batch_size=5,
        shuffle=True,
        transform=RandomAugment(),
        num_workers=num_workers,
        io_concurrency=io_concurrency,
        seed_per_sample=True,
        generator=torch.Generator().manual_seed(seed),
    )
    return list(loader)


def same(a, b):
    """Two epochs of dict batches are equal, tensor for tensor."""
    if len(a) != len(b):
        return False
    pairs = zip(a, b, strict=True)
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in pairs)


@pytest.mark.parametrize("source", [NoisySource, AsyncSource])
def test_seed_per_sample_makes_epochs_identical_across_worker_counts(source):
    """Random draws in __getitem__ (sync) and transform are bit-identical for 0-3 workers."""
    reference = epoch(source(60), 0, io_concurrency=1)
    for num_workers, io_concurrency in [(0, 64), (1, 8), (2, 64), (3, 2)]:
        assert same(epoch(source(60), num_workers, io_concurrency), reference), num_workers
    assert not same(epoch(source(60), 2, seed=4), reference), "another seed, other draws"


def test_without_seed_per_sample_the_training_process_draws_differently():
    """The check above can fail: without per-sample seeds, batches made in this process
    (num_workers=0) draw from its global RNGs, unlike batches made in workers."""
    torch.manual_seed(0)
    make = lambda n: AsyncLoader(  # noqa: E731
        SyncSource(30), batch_size=5, transform=RandomAugment(), num_workers=n,
        generator=torch.Generator().manual_seed(3),
    )  # fmt: skip
    assert not same(list(make(0)), list(make(2)))


def test_persistent_workers_see_set_epoch():
    """Sampling happens here, so sampler.set_epoch(e) takes effect with persistent workers."""
    ds = SyncSource(40)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    with AsyncLoader(
        ds, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True
    ) as loader:
        for e in range(3):
            sampler.set_epoch(e)
            fresh = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
            fresh.set_epoch(e)
            assert indices_of(loader) == list(fresh)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("sigkill", r"is killed by signal: Killed \(SIGKILL\)"),
        ("exit", "exited unexpectedly with exit code 3"),
    ],
)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_dying_worker_raises_names_its_batch_and_the_loader_recovers(
    tmp_path, how, expected, persistent
):
    """A worker killed mid-task raises WorkerCrashedError naming how and what it held."""
    before = worker_processes()
    loader = AsyncLoader(
        SyncSource(40),
        batch_size=4,
        num_workers=2,
        transform=DieAt(17, how, str(tmp_path / "died")),
        persistent_workers=persistent,
    )
    with pytest.raises(WorkerCrashedError, match=expected) as info:
        list(loader)
    assert "batch 4 (indices [16, 17, 18, 19])" in str(info.value)
    if not persistent:
        assert worker_processes() == before, "no orphan workers"
    assert indices_of(loader) == list(range(40)), "iterating again uses a fresh pool"
    loader.close()
    assert worker_processes() == before


def with_pid(samples):
    """Collates and tells which worker process made the batch."""
    return {"x": default_collate(samples), "pid": os.getpid()}


class InitError(Exception):
    """A user exception whose constructor takes an extra argument."""

    def __init__(self, message, worker):
        super().__init__(message)
        self.worker = worker


def failing_init(worker_id):
    raise InitError(f"no GPU for worker {worker_id}", worker_id)  # failing_init raises here


def collect_garbage(worker_id):
    gc.collect()


@pytest.mark.timeout(60)
def test_garbage_of_the_training_process_collected_in_a_worker_does_not_hang_it():
    """A forked worker inherits the training process's uncollected objects (here a running
    epoch's iterator in a reference cycle); collecting them there calls none of their
    finalizers, which would wait for the training process's threads."""
    first = AsyncLoader(SyncSource(40), batch_size=4)
    gc.disable()
    try:
        it = iter(first)
        next(it)
        holder = {"it": it}
        holder["self"] = holder
        del it, holder
        second = AsyncLoader(
            SyncSource(12), batch_size=4, num_workers=2, worker_init_fn=collect_garbage
        )
        assert indices_of(second) == list(range(12))
    finally:
        gc.enable()
        gc.collect()
        first.close()


class IndexLists(torch.utils.data.Dataset):
    """Item i: how many lists of the epoch's length this process holds (a worker that
    inherited the sampler's index list holds one)."""

    n = 20_000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return sum(type(o) is list and len(o) == self.n for o in gc.get_objects())


def test_workers_inherit_no_index_list_and_an_ended_epoch_keeps_none():
    """As under DataLoader the sampler draws after the workers fork, so they do not inherit
    the epoch's shuffled index list; and a closed epoch lets its list go."""
    loader = AsyncLoader(IndexLists(), batch_size=4, shuffle=True, num_workers=2,
                         persistent_workers=False)  # fmt: skip
    it = iter(loader)
    assert next(it).tolist() == [0, 0, 0, 0]
    it.close()
    del it
    gc.collect()
    assert sum(type(o) is list and len(o) == IndexLists.n for o in gc.get_objects()) == 0
    loader.close()


ROOT = REPO
COLLECTED_AT_FORK = """
import gc, os
from asyncloader import AsyncLoader
from tests.helpers import SyncSource, indices_of

if __name__ == "__main__":
    os.register_at_fork(before=gc.collect)  # as filelock's hook may collect at every fork
    gc.disable()
    first = AsyncLoader(SyncSource(40), batch_size=4)
    it = iter(first)
    next(it)
    holder = {"loader": first, "it": it}
    holder["self"] = holder
    del first, it, holder
    second = AsyncLoader(SyncSource(12), batch_size=4, num_workers=2)
    print(indices_of(second) == list(range(12)), flush=True)
"""
