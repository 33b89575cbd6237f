"""ShardedSource: a fixed order whatever the timing, and exact resume from state_dict()."""

import asyncio
import json
import random
import warnings

import pytest
import torch

from asyncloader import AsyncLoader
from asyncloader.sources import Retry, ShardedSource
from asyncloader.sources._sharded.stream import DEPTH, ShardStream
from tests.helpers import shard_set
from tests.helpers.contracts import check_resume
from tests.helpers.sources import as_worker
from tests.servers import Faults

FAST = Retry(attempts=8, backoff=0.001, max_backoff=0.01)
SIZES = [7, 12, 5, 9, 3, 11, 6]


def write_shards(tmp_path, sizes):
    """Local tar shards (shard_set) on disk; returns their paths."""
    paths = []
    for name, data in shard_set(len(sizes), sizes).items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    return paths


def make(paths, counts=SIZES, **kwargs):
    opts = {"shuffle_buffer": 6, "shard_concurrency": 3, "retry": FAST, "seed": 7}
    return ShardedSource(paths, samples_per_shard=counts, **opts | kwargs)


def instrument(source, seed=None):
    """Records each stream the source opens as (path, offset); with ``seed``, cuts the bytes
    into small chunks, each after a random number of turns of the event loop, so reads finish
    in a random order (the same for a seed, whatever the clock)."""
    client, opened = source._client, []
    inner = client.stream
    rng = random.Random(seed)

    async def stream(target, start, pin):
        opened.append((client.shown(target), start))
        async for chunk in inner(target, start, pin):
            for at in range(0, len(chunk), 4096):
                for _ in range(rng.randrange(4) if seed is not None else 0):
                    await asyncio.sleep(0)
                yield chunk[at : at + 4096]

    client.stream = stream
    return opened


def key(sample):
    return sample["__key__"]


async def _take(source, n=None):
    it = aiter(source)
    out = []
    try:
        while n is None or len(out) < n:
            try:
                out.append(key(await anext(it)))
            except StopAsyncIteration:
                break
    finally:
        await it.aclose()
    return out


def take(source, n=None):
    """The keys of the first ``n`` samples (all without ``n``) of a fresh iteration."""
    return asyncio.run(_take(source, n))


def stop_after(source, n):
    """Takes ``n`` samples, then returns them and the state (through a JSON round trip)."""
    head = take(source, n)
    return head, json.loads(json.dumps(source.state_dict()))


def resumed(make_source, state):
    """The rest of the epoch from a new source loaded with ``state``, and the streams it opened."""
    source = make_source()
    opened = instrument(source)
    source.load_state_dict(state)
    return take(source), opened


def test_interleave_is_round_robin_in_plan_order(tmp_path):
    """Unshuffled, two at once: slots take turns, an ended slice's slot goes to the next."""
    paths = write_shards(tmp_path, [3, 1, 2])
    source = make(paths, [3, 1, 2], shuffle=False, shard_concurrency=2)
    order = ["s000-0000", "s001-0000", "s000-0001", "s002-0000", "s000-0002", "s002-0001"]
    assert take(source) == order


def test_order_does_not_depend_on_read_timing(tmp_path):
    """Random per-chunk latency, three slices at once: every run gives the same order."""
    paths = write_shards(tmp_path, SIZES)
    runs = []
    for seed in range(3):
        source = make(paths)
        instrument(source, seed)
        runs.append(take(source))
    assert runs[0] == runs[1] == runs[2]
    assert sorted(runs[0]) == sorted(
        f"s{s:03d}-{i:04d}" for s, n in enumerate(SIZES) for i in range(n)
    )


def test_order_over_http_does_not_depend_on_faults(http_server):
    """Over HTTP, with different 503s and resets (so retries and timing), the order is fixed."""
    shards = shard_set(len(SIZES), SIZES)
    runs = []
    for seed in (1, 2):
        server = http_server(shards, Faults(rates={"503": 0.2, "reset": 0.1}, seed=seed))
        runs.append(take(make([server.url(name) for name in shards])))
    assert runs[0] == runs[1] and len(runs[0]) == sum(SIZES)


def ids(batch):
    """Collates sample dicts into a tensor of their numeric keys (s003-0007 -> 3007)."""
    return torch.tensor([int(k[1:4]) * 1000 + int(k[5:]) for k in map(key, batch)])


@pytest.mark.parametrize("epoch", [0, 3])
def test_resume_through_the_loader_is_batch_for_batch(tmp_path, epoch):
    """Checkpoints at several batches (mid-shard), resumed in a new loader: the same batches,
    and no fast-forward warning."""
    paths = write_shards(tmp_path, SIZES)

    def make_loader(**kw):
        source = make(paths)
        source.set_epoch(epoch)
        return AsyncLoader(source, batch_size=4, collate_fn=ids, **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_resume(make_loader, [0, 1, 5, 9, 12, 13])


def test_fully_consumed_slices_are_not_read_again(tmp_path):
    """After load_state_dict, a shard whose samples all went out before is never opened."""
    sizes = [6] * 8
    paths = write_shards(tmp_path, sizes)
    reference = take(make(paths, sizes, shard_concurrency=2, shuffle_buffer=4))
    n = 30
    head, state = stop_after(make(paths, sizes, shard_concurrency=2, shuffle_buffer=4), n)
    assert head == reference[:n]
    gone = {s for s in range(8) if all(f"s{s:03d}-{i:04d}" in head for i in range(6))}
    assert len(gone) >= 2, gone
    rest, opened = resumed(lambda: make(paths, sizes, shard_concurrency=2, shuffle_buffer=4), state)
    assert rest == reference[n:]
    assert opened and not {paths[s] for s in gone} & {path for path, _ in opened}


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_resumes_with_its_exact_remaining_samples(tmp_path, world_size):
    """Per rank, at the start, mid-epoch, one before and at the end: the rank's own rest."""
    sizes = [5, 13, 8, 2, 11, 7, 9]
    paths = write_shards(tmp_path, sizes)
    for rank in range(world_size):
        mk = lambda: make(paths, sizes, rank=rank, world_size=world_size)  # noqa: B023, E731
        reference = take(mk())
        assert len(reference) == sum(sizes) // world_size
        for n in (0, 1, len(reference) // 2, len(reference) - 1, len(reference)):
            head, state = stop_after(mk(), n)
            assert head == reference[:n] and state["rank"] == rank
            assert resumed(mk, state)[0] == reference[n:], (rank, n)


def test_a_state_carries_its_epoch(tmp_path):
    """A state saved in epoch 2 resumes epoch 2 in a source left at epoch 0; set_epoch after
    that starts the new epoch from its beginning."""
    paths = write_shards(tmp_path, SIZES)
    source = make(paths)
    source.set_epoch(2)
    reference = take(source)
    source.set_epoch(2)
    head, state = stop_after(source, 10)
    assert head == reference[:10]
    assert state["epoch"] == 2 and state["yielded"] == 10
    fresh = make(paths)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert take(fresh) == reference[10:]
    fresh.set_epoch(2)
    assert take(fresh) == reference


def test_resume_without_sample_counts_replays_exactly(tmp_path):
    """Without samples_per_shard the epoch is re-read and the samples already given dropped."""
    paths = write_shards(tmp_path, SIZES)
    reference = take(make(paths, None))
    _, state = stop_after(make(paths, None), 17)
    assert resumed(lambda: make(paths, None), state)[0] == reference[17:]


def test_skipped_samples_keep_their_places_in_the_order(tmp_path):
    """With on_error='skip', samples decode rejects are left out and resume stays exact."""
    paths = write_shards(tmp_path, SIZES)

    def decode(sample):
        if sample["__key__"].endswith("3"):
            raise ValueError("rejected")
        return sample

    mk = lambda: make(paths, decode=decode, on_error="skip", max_skipped=100)  # noqa: E731
    reference = take(mk())
    assert not any(k.endswith("3") for k in reference) and len(reference) == sum(SIZES) - 6
    head, state = stop_after(mk(), 20)
    assert head == reference[:20] and state["yielded"] >= 20
    assert resumed(mk, state)[0] == reference[20:]


def test_any_ranks_state_loads_and_one_past_the_end_is_refused(tmp_path):
    """load_state_dict checks the position; any rank's state will do (another world size's
    too: tests/integration/sources/test_sharded_elastic.py)."""
    paths = write_shards(tmp_path, SIZES)
    state = make(paths, rank=0, world_size=2).state_dict()
    assert state == {
        "epoch": 0,
        "yielded": 0,
        "rank": 0,
        "world_size": 2,
        "shuffle_initial": 6,
        "worker_split": "samples",
        "distributed_tail": "drop",
        "history": [],
    }
    make(paths, rank=1, world_size=2).load_state_dict(state)  # ranks step together
    with pytest.raises(ValueError, match="yielded=99 is outside this rank's epoch"):
        make(paths).load_state_dict({**state, "yielded": 99, "world_size": 1})


def test_reads_at_once_and_queued_samples_stay_bounded(tmp_path):
    """Under random latency: at most shard_concurrency streams open, each queue <= DEPTH."""
    paths = write_shards(tmp_path, SIZES)
    source = make(paths)
    instrument(source, seed=4)
    inner = source._client.stream
    active, peak, queued = [0], [0], [0]

    async def stream(target, start, pin):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        try:
            async for chunk in inner(target, start, pin):
                yield chunk
        finally:
            active[0] -= 1

    source._client.stream = stream

    async def run():
        it = aiter(source)
        assert isinstance(it, ShardStream)
        out = []
        async for sample in it:
            queued[0] = max([queued[0], *(q.qsize() for q in it._queues.values())])
            out.append(sample)
        return out

    assert len(asyncio.run(run())) == sum(SIZES)
    assert 1 < peak[0] <= 3 and queued[0] <= DEPTH


def counting(source):
    """Counts the samples the source's readers have produced so far."""
    inner, produced = source.items, [0]

    async def items(slc, want):
        async for item in inner(slc, want):
            produced[0] += 1
            yield item

    source.items = items
    return produced


def test_the_first_sample_waits_for_shuffle_initial_not_a_full_buffer(tmp_path):
    """With shuffle_initial=4 of a 40-sample buffer, the first sample goes out long before 40
    are read (the queues add at most (2 * DEPTH + 2) per open slice); a full buffer would
    need all 40."""
    paths = write_shards(tmp_path, SIZES)
    source = make(paths, shuffle_buffer=40, shuffle_initial=4)
    produced = counting(source)

    async def first():
        it = aiter(source)
        try:
            await anext(it)
            return produced[0]
        finally:
            await it.aclose()

    assert asyncio.run(first()) <= 4 + (2 * DEPTH + 2) * 3 < 40
    full = make(paths, shuffle_buffer=40, shuffle_initial=40)
    produced_full = counting(full)
    take(full, 1)
    assert produced_full[0] >= 40


def test_a_growing_shuffle_buffer_gives_each_sample_once_and_resumes_exactly(tmp_path):
    """The buffer starts yielding at shuffle_initial and grows to shuffle_buffer; the epoch is
    still every sample once, and a resume at any step continues it exactly (the replay models
    the growth)."""
    paths = write_shards(tmp_path, SIZES)

    def source():
        return make(paths, shuffle_buffer=20, shuffle_initial=3)

    reference = take(source())
    assert sorted(reference) == sorted(take(make(paths, shuffle=False)))
    assert reference != take(make(paths, shuffle_buffer=20, shuffle_initial=20))
    for n in range(0, sum(SIZES), 5):
        head, state = stop_after(source(), n)
        assert head + resumed(source, state)[0] == reference, n


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (7, ValueError), (True, TypeError), (2.0, TypeError)]
)
def test_shuffle_initial_is_checked(tmp_path, value, error):
    with pytest.raises(error, match="shuffle_initial"):
        make(write_shards(tmp_path, [2]), [2], shuffle_buffer=6, shuffle_initial=value)


def test_a_state_from_before_shuffle_initial_resumes_with_a_full_first_fill(tmp_path):
    """A checkpoint without shuffle_initial was taken when the buffer filled before the first
    draw: resuming it follows that order, so nothing is lost or repeated."""
    paths = write_shards(tmp_path, SIZES)
    old = make(paths, shuffle_buffer=20, shuffle_initial=20)
    reference = take(old)
    head, state = stop_after(make(paths, shuffle_buffer=20, shuffle_initial=20), 9)
    del state["shuffle_initial"]
    rest, _ = resumed(lambda: make(paths, shuffle_buffer=20, shuffle_initial=3), state)
    assert head + rest == reference


def keys_of(source):
    async def run():
        return [s["__key__"] async for s in source]

    return asyncio.run(run())


def test_workers_split_the_rank_by_sample_count_and_old_states_keep_their_split(tmp_path):
    """A worker's part holds per // workers samples (so every rank's workers end with the
    same partial batches); a state from before that rule resumes with the old one."""
    paths = write_shards(tmp_path, SIZES)  # 53 samples: 26 per rank of 2, 13 per worker
    for rank in range(2):
        parts = []
        for worker in range(2):
            with as_worker(worker, 2):
                parts.append(keys_of(make(paths, rank=rank, world_size=2)))
        assert [len(p) for p in parts] == [13, 13]
    source = make(paths, shuffle=False, shard_concurrency=1)
    old = {k: v for k, v in source.state_dict().items() if k != "worker_split"}
    with as_worker(1, 2):
        source.load_state_dict(old)
        assert source.state_dict()["worker_split"] == "slices"
        got = keys_of(source)
    every_other = [s.shard for s in source.slices()[1::2]]
    assert got == [f"s{s:03d}-{i:04d}" for s in every_other for i in range(SIZES[s])]
