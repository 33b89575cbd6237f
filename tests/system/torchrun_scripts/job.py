"""One rank of a torchrun job (tests/system/test_torchrun.py): distributed loaders in a training
loop.

Each step takes one batch from every loader still going, then all-gathers what every rank got
(the step's all-reduce: a rank with fewer batches would leave the others waiting). Rank 0
logs each step's gather as a JSON line and then writes a checkpoint of every loader's
``state_dict()``, atomically; ``--crash-at EPOCH STEP`` then SIGKILLs the last rank, as a
lost machine would, and torchrun takes the job down.
"""

import argparse
import json
import operator
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from asyncloader import AsyncLoader
from asyncloader.sources import ShardedSource

MAP_SAMPLES = 60


def loaders(kinds: list[str], shards: Path) -> dict[str, AsyncLoader]:
    out = {}
    if "map" in kinds:
        out["map"] = AsyncLoader(
            list(range(MAP_SAMPLES)),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
            distributed=True,
            num_workers=2,
        )
    if "sharded" in kinds:
        urls = sorted(str(p) for p in shards.glob("*.tar"))
        source = ShardedSource(urls, seed=3, shuffle_buffer=8, decode=operator.itemgetter("txt"))
        out["sharded"] = AsyncLoader(
            source, batch_size=4, distributed=True, num_workers=2, fetch_in_workers=True
        )
    return out


def ids(batch) -> list:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    return [b.decode() for b in batch]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default="map,sharded")
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--crash-at", type=int, nargs=2, default=None)
    parser.add_argument("--stats", type=Path, help="each epoch's wait percentiles per rank")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    job = loaders(args.kinds.split(","), args.shards)
    epoch = 0
    if args.resume:
        saved = json.loads(args.checkpoint.read_text())
        for kind, loader in job.items():
            loader.load_state_dict(saved[kind])
        epoch = min(saved[kind]["epoch"] for kind in job)
    log = args.record.open("a") if rank == 0 else None
    while epoch < args.epochs:
        running = {kind: iter(loader) for kind, loader in job.items()}
        step = 0
        while True:
            got = {}
            for kind in list(running):
                batch = next(running[kind], None)
                if batch is None:
                    del running[kind]
                else:
                    got[kind] = ids(batch)
            everyone: list = [None] * world
            dist.all_gather_object(everyone, got)
            if not any(everyone):
                break
            if log is not None:
                log.write(json.dumps({"epoch": epoch, "step": step, "ranks": everyone}) + "\n")
                log.flush()
                state = {kind: loader.state_dict() for kind, loader in job.items()}
                args.checkpoint.with_suffix(".tmp").write_text(json.dumps(state))
                args.checkpoint.with_suffix(".tmp").replace(args.checkpoint)
            dist.barrier()
            if args.crash_at == [epoch, step] and rank == world - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            step += 1
        for kind, loader in job.items():
            per_rank = loader.stats_by_rank()  # a collective: every rank calls it
            if args.stats is not None and rank == 0:
                waits = [[s.batches, s.wait_p50_ms, s.wait_p95_ms, s.wait_p99_ms] for s in per_rank]
                with args.stats.open("a") as out:
                    out.write(json.dumps({"epoch": epoch, "kind": kind, "ranks": waits}) + "\n")
        epoch += 1
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
