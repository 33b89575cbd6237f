"""distributed=True: the loader partitions a map-style source across ranks and advances the
epoch itself. Ranks are simulated in one process with rank= and world_size=."""

import pytest
import torch

from asyncloader import AsyncLoader

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
        ({"distributed": True, "sampler": [0, 1]}, ValueError, "sampler"),
    ],
)
def test_bad_options_name_themselves(options, error, match):
    with pytest.raises(error, match=match):
        AsyncLoader(list(range(4)), **options)


def test_an_iterable_source_splits_itself():
    with pytest.raises(ValueError, match="map-style"):
        AsyncLoader(iter(range(4)), distributed=True, rank=0, world_size=2)
