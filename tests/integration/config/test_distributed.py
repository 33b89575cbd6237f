"""distributed=True: the loader partitions a map-style source across ranks, advances the
epoch itself, tells samplers and sources the epoch, and resumes at another world size.
Ranks are simulated in one process with rank= and world_size= (they step together)."""

from collections import Counter

import pytest
import torch
from torch.utils.data import DistributedSampler

from asyncloader import AsyncLoader
from asyncloader.sources import ShardedSource
from tests.helpers import shard_set

pytestmark = pytest.mark.timeout(60)


def rank_epochs(n, world, epochs=1, **options):
    """rank -> list of epochs -> flat list of the sample indices that rank received."""
    out = []
    for rank in range(world):
        loader = AsyncLoader(
            list(range(n)),
            batch_size=2,
            shuffle=True,
            distributed=True,
            rank=rank,
            world_size=world,
            **options,
        )
        out.append([[int(x) for batch in loader for x in batch] for _ in range(epochs)])
    return out


def union(per_rank, epoch):
    return sorted(x for ranks in per_rank for x in ranks[epoch])


def test_an_even_dataset_is_split_exactly_once_with_equal_steps():
    per_rank = rank_epochs(12, 3)
    assert union(per_rank, 0) == list(range(12))
    assert {len(r[0]) for r in per_rank} == {4}


def test_the_tail_is_padded_or_dropped():
    padded = rank_epochs(10, 3)
    assert {len(r[0]) for r in padded} == {4}  # 12 places: 2 samples given twice
    assert set(union(padded, 0)) == set(range(10)) and len(union(padded, 0)) == 12
    dropped = rank_epochs(10, 3, distributed_tail="drop")
    assert {len(r[0]) for r in dropped} == {3}
    got = union(dropped, 0)
    assert len(got) == len(set(got)) == 9  # each at most once, fewer than world_size left out


def test_each_iter_is_the_next_epoch_the_same_on_every_rank():
    per_rank = rank_epochs(12, 3, epochs=3)
    for epoch in range(3):
        assert union(per_rank, epoch) == list(range(12))
    assert per_rank[0][0] != per_rank[0][1] != per_rank[0][2]
    again = rank_epochs(12, 3, epochs=3)  # a fresh job: the same epochs
    assert again == per_rank


def test_the_generator_seeds_the_permutation():
    a = rank_epochs(12, 2, generator=torch.Generator().manual_seed(1))
    b = rank_epochs(12, 2, generator=torch.Generator().manual_seed(2))
    assert a != b and union(a, 0) == union(b, 0) == list(range(12))


def test_resume_mid_epoch_at_the_same_world_size_is_exact():
    def loader():
        return AsyncLoader(
            list(range(24)), batch_size=2, shuffle=True, distributed=True, rank=1, world_size=2
        )

    whole = loader()
    epochs = [[b.tolist() for b in whole] for _ in range(2)]
    first = loader()
    list(first)  # epoch 0
    it = iter(first)
    head = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == epochs[1]


def test_workers_give_the_same_partition():
    alone = rank_epochs(12, 2)
    with_workers = rank_epochs(12, 2, num_workers=2)
    assert alone == with_workers


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"rank": 0, "world_size": 2}, ValueError, "needs distributed=True"),
        ({"distributed": True, "rank": 2, "world_size": 2}, ValueError, "rank"),
        ({"distributed": True, "rank": 0}, ValueError, "go together"),
        ({"distributed": True, "rank": True, "world_size": 2}, TypeError, "rank"),
        ({"distributed": True, "distributed_tail": "wrap"}, ValueError, "distributed_tail"),
    ],
)
def test_bad_options_name_themselves(options, error, match):
    with pytest.raises(error, match=match):
        AsyncLoader(list(range(4)), **options)


def test_ranks_come_from_torch_distributed_as_each_epoch_starts(monkeypatch):
    """A loader built before init_process_group partitions by the group it iterates in."""
    loader = AsyncLoader(list(range(12)), batch_size=2, shuffle=True, distributed=True)
    assert len(loader) == 6  # no group yet: a single rank
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    explicit = loader_at(12, 1, 3)
    assert len(loader) == 2 and [b.tolist() for b in loader] == [b.tolist() for b in explicit]
    assert loader.state_dict()["distributed"]["world_size"] == 3


@pytest.mark.parametrize("tail", ["pad", "drop"])
def test_the_partition_is_distributed_samplers(tail):
    """A job mixing these loaders with DistributedSampler-fed ones agrees on every epoch."""
    for epoch in range(2):
        for rank in range(3):
            torch_sampler = DistributedSampler(
                range(10), num_replicas=3, rank=rank, seed=4, drop_last=tail == "drop"
            )
            torch_sampler.set_epoch(epoch)
            loader = loader_at(10, rank, 3, distributed_tail=tail, batch_size=None, seed=4)
            got = [[int(x) for x in loader] for _ in range(epoch + 1)][epoch]
            assert got == list(torch_sampler)


def test_your_sampler_is_told_each_epoch():
    """With your own sampler the loader does not partition, it sets the sampler's epoch."""
    data = list(range(12))

    def epochs(rank):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, seed=1)
        loader = AsyncLoader(data, batch_size=3, sampler=sampler, distributed=True)
        return [[int(x) for b in loader for x in b] for _ in range(2)]

    ranks = [epochs(0), epochs(1)]
    for epoch in range(2):
        assert sorted(ranks[0][epoch] + ranks[1][epoch]) == data
    assert ranks[0][0] != ranks[0][1]


class EpochAware(torch.utils.data.IterableDataset):
    """Yields (rank, world_size, epoch) as it was told them, once per item."""

    def __init__(self):
        self.place, self.epoch = None, None

    def set_rank(self, rank, world_size):
        self.place = (rank, world_size)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter([(*self.place, self.epoch)] * 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_source_is_told_its_place_and_each_epoch(workers):
    loader = AsyncLoader(
        EpochAware(),
        batch_size=None,
        distributed=True,
        rank=1,
        world_size=3,
        num_workers=workers,
        fetch_in_workers=bool(workers),
    )
    for epoch in range(3):
        assert {tuple(int(v) for v in item) for item in loader} == {(1, 3, epoch)}


def test_a_sharded_source_splits_across_ranks_with_new_order_each_epoch(tmp_path):
    shards = shard_set(6, 5)
    for name, data in shards.items():
        (tmp_path / name).write_bytes(data)
    urls = [str(tmp_path / name) for name in shards]

    def keys(rank, workers):
        source = ShardedSource(urls, samples_per_shard=5, seed=3, shuffle_buffer=4)
        loader = AsyncLoader(
            source,
            batch_size=2,
            collate_fn=list,
            distributed=True,
            rank=rank,
            world_size=3,
            num_workers=workers,
            fetch_in_workers=bool(workers),
        )
        return [[s["__key__"] for b in loader for s in b] for _ in range(2)]

    for workers in (0, 2):
        ranks = [keys(rank, workers) for rank in range(3)]
        for epoch in range(2):
            union = [k for r in ranks for k in r[epoch]]
            assert len(union) == len(set(union)) == 30
            assert {len(r[epoch]) for r in ranks} == {10}
        assert ranks[0][0] != ranks[0][1]


def test_a_sharded_source_built_for_another_rank_is_refused(tmp_path):
    source = ShardedSource(["a.tar"], rank=0, world_size=2)
    with pytest.raises(ValueError, match="built for rank 0 of 2"):
        AsyncLoader(source, distributed=True, rank=1, world_size=2)


def loader_at(n, rank, world, batch_size=2, seed=0, **options):
    return AsyncLoader(
        list(range(n)),
        batch_size=batch_size,
        shuffle=True,
        distributed=True,
        rank=rank,
        world_size=world,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


def interrupted(n, world, steps, **options):
    """Every rank of ``world`` takes ``steps`` batches of epoch 1: (samples taken, rank 0's
    state). Epoch 0 runs whole first, so the state is not of a job's first epoch."""
    taken, state = [], None
    for rank in range(world):
        loader = loader_at(n, rank, world, **options)
        list(loader)
        it = iter(loader)
        for _ in range(steps):
            taken += [int(x) for x in next(it)]
        if rank == 0:
            state = loader.state_dict()
        del it
    return taken, state


def resumed(n, world, state, epochs=1, **options):
    """Per new rank: the samples of the resumed epoch (and ``epochs - 1`` more)."""
    out = []
    for rank in range(world):
        loader = loader_at(n, rank, world, **options)
        loader.load_state_dict(state)
        out.append([[int(x) for b in loader for x in b] for _ in range(epochs)])
    return out


@pytest.mark.parametrize(("n", "old", "new"), [(48, 4, 2), (48, 4, 3), (52, 2, 5)])
def test_elastic_resume_gives_what_was_left_each_once(n, old, new):
    """Sizes where nothing is padded: what was left divides among the new ranks."""
    taken, state = interrupted(n, old, steps=3)
    after = resumed(n, new, state, epochs=2)
    rest = [x for r in after for x in r[0]]
    assert sorted(taken + rest) == list(range(n))  # each sample once across the resume
    assert len({len(r[0]) for r in after}) == 1  # every new rank the same number of steps
    fresh = [[[int(x) for b in loader for x in b] for _ in range(3)][2]
             for loader in (loader_at(n, r, new) for r in range(new))]  # fmt: skip
    assert [r[1] for r in after] == fresh  # the next epoch (2) is a fresh job's


def test_elastic_resume_pads_or_drops_only_its_own_tail():
    n = 50  # 4 ranks: 13 each with padding; after 3 steps 26 remain, for 3 ranks
    taken, state = interrupted(n, 4, steps=3)
    padded = [x for r in resumed(n, 3, state) for x in r[0]]
    assert set(taken + padded) == set(range(n)) and len(padded) == 27  # one repeat
    assert sum(c - 1 for c in Counter(taken + padded).values()) == 1
    taken, state = interrupted(n, 4, steps=3, distributed_tail="drop")
    dropped = [x for r in resumed(n, 3, state, distributed_tail="drop") for x in r[0]]
    together = taken + dropped
    assert len(together) == len(set(together)) and n - len(together) < 4 + 3


def test_elastic_resume_twice_and_then_at_the_same_size_stays_exact():
    n = 60
    taken, state = interrupted(n, 4, steps=2)  # 16 taken
    loaders = [loader_at(n, r, 3) for r in range(3)]
    for loader in loaders:
        loader.load_state_dict(state)
    its = [iter(loader) for loader in loaders]
    for it in its:
        taken += [int(x) for x in next(it)]  # 6 more, at 3 ranks
    second = loaders[1].state_dict()
    assert second["distributed"]["history"] == [[4, 4, "pad"]]
    rest_at_3 = [[int(x) for b in it for x in b] for it in its]  # the uninterrupted remainder
    again = resumed(n, 3, second)
    assert [r[0] for r in again] == rest_at_3  # the same size: the same batches
    rest = [x for r in resumed(n, 2, second) for x in r[0]]
    assert sorted(taken + rest) == list(range(n))


def test_state_right_after_an_elastic_load_is_the_new_worlds():
    _, state = interrupted(24, 4, steps=1)
    loader = loader_at(24, 0, 2)
    loader.load_state_dict(state)
    now = loader.state_dict()
    assert now["distributed"]["world_size"] == 2 and now["next_batch"] == 0
    assert now["distributed"]["history"] == [[4, 2, "pad"]]
    again = loader_at(24, 0, 2)
    again.load_state_dict(now)
    assert len(list(again)) == len(list(loader)) == 4  # 16 left, 8 per rank, 2 per batch


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"n": 30}, "a dataset of 24"),
        ({"seed": 9}, "seed 0"),
        ({"shuffle": False}, "shuffle= True"),
        ({"batch_size": 3}, "batch_size=2"),
    ],
)
def test_a_state_for_another_order_is_refused(change, match):
    _, state = interrupted(24, 2, steps=1)
    n = change.pop("n", 24)
    loader = loader_at(n, 0, 2, **change) if "shuffle" not in change else AsyncLoader(
        list(range(n)), batch_size=2, distributed=True, rank=0, world_size=2, **change
    )  # fmt: skip
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict(state)


def test_an_out_of_order_position_does_not_move_to_another_world_size():
    _, state = interrupted(24, 2, steps=1)
    state = {**state, "next_batch": 0, "delivered_beyond": [1]}
    loader_at(24, 0, 2).load_state_dict(state)  # the same size: fine
    with pytest.raises(ValueError, match="in_order=True"):
        loader_at(24, 0, 3).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sharded_source_resumed_between_epochs_gives_the_next_epoch_whole(tmp_path, workers):
    """The state after an epoch carries the source's finished position; the epoch the loader
    tells it afterwards wins, so the next epoch is the uninterrupted job's."""
    for name, data in shard_set(4, 5).items():
        (tmp_path / name).write_bytes(data)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))

    def loader():
        source = ShardedSource(urls, samples_per_shard=5, seed=1, shuffle_buffer=4)
        options = {"num_workers": workers, "fetch_in_workers": bool(workers)}
        return AsyncLoader(
            source, batch_size=3, collate_fn=list, distributed=True, rank=0, world_size=1,
            **options,
        )  # fmt: skip

    def keys(loader):
        return [s["__key__"] for b in loader for s in b]

    whole = loader()
    epochs = [keys(whole) for _ in range(2)]
    first = loader()
    assert keys(first) == epochs[0]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    assert keys(resumed) == epochs[1] and len(epochs[1]) == 20
