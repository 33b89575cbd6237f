"""``shuffle=True``'s batches, sliced from the permutation
(:func:`asyncloader._base.compat.shuffled_batches`), are torch's own: the same batches and the
same generator draws, at the same points, as iterating torch's ``BatchSampler`` itself."""

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from asyncloader import AsyncLoader
from asyncloader._base.compat import shuffled_batches


class Dataset(list):
    pass


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, size", [(1, 4), (3, 4), (16, 4), (17, 4), (1000, 7), (1000, 1000)])
@pytest.mark.parametrize("seeded", [True, False])
def test_batches_and_draws_are_torchs(n, size, drop_last, seeded):
    """Batch for batch, and the generator (or torch's global RNG) in the same state after
    each batch, as torch's iteration leaves it; two epochs running."""

    def sampler():
        generator = torch.Generator().manual_seed(3) if seeded else None
        return BatchSampler(RandomSampler(range(n), generator=generator), size, drop_last)

    def rng(s):
        return s.sampler.generator.get_state() if seeded else torch.get_rng_state()

    theirs, ours = sampler(), sampler()
    torch.manual_seed(11)
    want = []
    for _ in range(2):
        want += [(batch, rng(theirs)) for batch in theirs]
    torch.manual_seed(11)
    got = []
    for _ in range(2):
        it = shuffled_batches(ours)
        assert it is not None
        got += [(batch, rng(ours)) for batch in it]
    assert [b for b, _ in got] == [b for b, _ in want]
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(got, want, strict=True))
    assert rng(ours).equal(rng(theirs))


def test_the_last_draw_comes_when_the_permutation_runs_out():
    """torch draws once more from the generator when the permutation runs out: before the
    short last batch, or on the pull after the last full one."""
    for n in (16, 17):
        theirs = BatchSampler(RandomSampler(range(n), generator=torch.Generator()), 4, False)
        ours = BatchSampler(RandomSampler(range(n), generator=torch.Generator()), 4, False)
        states = []
        for s, it in ((theirs, iter(theirs)), (ours, shuffled_batches(ours))):
            states.append([s.sampler.generator.get_state() for _ in itertools.takewhile(bool, it)])
        assert all(torch.equal(a, b) for a, b in zip(*states, strict=True))


@pytest.mark.parametrize(
    "sampler",
    [
        BatchSampler(RandomSampler(range(10), replacement=True), 4, False),
        BatchSampler(RandomSampler(range(10), num_samples=25), 4, False),
        BatchSampler(SequentialSampler(range(10)), 4, False),
        BatchSampler(type("Mine", (RandomSampler,), {})(range(10)), 4, False),
        type("MyBatches", (BatchSampler,), {})(RandomSampler(range(10)), 4, False),
        RandomSampler(range(10)),
        [[0, 1], [2, 3]],
    ],
    ids=["replacement", "num_samples", "sequential", "sampler-subclass", "batch-subclass",
         "no-batches", "a-list"],
)  # fmt: skip
def test_anything_else_is_iterated_as_it_is(sampler):
    assert shuffled_batches(sampler) is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_shuffled_loader_gives_dataloaders_order(num_workers):
    """End to end: three epochs of shuffle=True with a seeded generator, as DataLoader."""
    data = list(range(103))
    kwargs = {"batch_size": 8, "shuffle": True, "num_workers": num_workers}
    reference = DataLoader(data, generator=torch.Generator().manual_seed(5), **kwargs)
    with AsyncLoader(data, generator=torch.Generator().manual_seed(5), **kwargs) as loader:
        for _ in range(3):
            assert [b.tolist() for b in loader] == [b.tolist() for b in reference]
