"""One rank of the disk cache's torchrun job (tests/integration/sources/test_disk_cache.py): two
ranks, each
with two fetching workers, read tar shards over HTTP through one cache directory.

First every rank reads every shard (``rank=0, world_size=1`` on each, the same order): each
shard is wanted by four processes at once, the cache's worst case. Then one epoch with
``distributed=True`` (each rank its share), all from the cache. Each rank writes what it got
and what the cache counted to ``<out>/rank<r>.json``.
"""

import argparse
import json
import operator
from pathlib import Path

import torch.distributed as dist

from asyncloader import AsyncLoader
from asyncloader.sources import DiskCache, ShardedSource


def keys_of(loader: AsyncLoader) -> list[str]:
    return [key for batch in loader for key in batch]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", type=Path, required=True, help="a JSON list of shard URLs")
    parser.add_argument("--counts", type=Path, required=True, help="a JSON list of counts")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    urls, counts = json.loads(args.urls.read_text()), json.loads(args.counts.read_text())
    cache = DiskCache(args.cache, max_bytes=1 << 30)
    common = dict(samples_per_shard=counts, seed=5, decode=operator.itemgetter("__key__"))
    everything = ShardedSource(urls, rank=0, world_size=1, cache=cache, **common)
    workers = dict(num_workers=2, fetch_in_workers=True, collate_fn=list)
    whole = keys_of(AsyncLoader(everything, batch_size=4, **workers))
    dist.barrier()
    shared = ShardedSource(urls, cache=cache, **common)
    share = keys_of(AsyncLoader(shared, batch_size=2, distributed=True, collate_fn=list))
    dist.barrier()
    result = {"rank": rank, "whole": whole, "share": share, "stats": vars(cache.stats)}
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
