"""Parquet and JSON Lines over HTTP: ParquetSource and JsonlSource against Hugging Face
``datasets`` streaming and pyarrow, and ``datasets`` streaming itself under each loader.

The data: 16 Parquet files of 4 row groups of 2,000 rows (``id``; ``text``, 60 words;
``tokens``, 128 ``int32``), 128,000 rows, and the same rows as 16 zstd-compressed JSON Lines
files; served by :class:`benchmarks.range_server.RangeServer` (byte ranges, ETags) with 20 ms
added per request, in a process of its own. Every case reads every row once, with
``batch_size=256`` and ``collate_fn=list`` (rows as dicts, as ``to_pylist`` gives them), and
checks that each ``id`` came once.

Cases (rows/s over the epoch, from building the loader to its last batch; each case's
libraries are imported before the clock starts):

- ``pyarrow local``: ``ParquetFile(path).iter_batches(256)`` plus ``to_pylist`` from local
  disk, one process: the CPU's cost of the rows, with no network;
- ``datasets DataLoader N``: ``load_dataset("parquet", data_files=urls, streaming=True)``
  under DataLoader with N workers (each worker reads its own files);
- ``datasets AsyncLoader 0``, ``datasets AsyncLoader 2 fetch_in_workers``: the same
  IterableDataset under AsyncLoader, in the placement the README gives for iterables that
  shard themselves across workers;
- ``ParquetSource`` (0 workers) and ``ParquetSource 2 fetch_in_workers``;
- ``ParquetSource default_collate`` and ``datasets DataLoader 2 default_collate``: the
  default collate instead of ``list`` (DataLoader's batch of these rows: ``id`` an int64
  tensor, ``text`` a list of strings, ``tokens`` a list of 128 int64 tensors, one per
  position); asyncloader builds it from the Arrow columns;
- ``jsonl datasets DataLoader 2`` and ``JsonlSource``: the zstd files, ``load_dataset("json",
  ..., streaming=True)`` against JsonlSource; ``JsonlSource arrow``: ``parse="arrow"``;
- ``JsonlSource arrow default_collate`` and ``jsonl datasets DataLoader 2 default_collate``:
  the same under the default collate (asyncloader builds the batch from pyarrow's columns);
- ``Packed``: ``Packed(ParquetSource(urls, columns=["tokens"]), 2048, key="tokens")``,
  batch 8: tokens/s, the tree's peak RSS sampled over the epoch, and the training process's
  RSS at each tenth of the epoch (``rss_growth_mb``: the last less the first; flat memory
  keeps it near 0).

Also measured once: the bytes the server sent for ``ParquetSource(columns=["id"])``, against
the ``id`` column chunks plus the footers; and the same under a ``filter`` that keeps the
last sixteenth of the rows (the other row groups ruled out by their statistics).

``python -m benchmarks.probes.columnar [--reps 5] [--only CASE...] [--save [SECTION]]
[--toy]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import side_by_side

MODULE = "benchmarks.probes.columnar"
#: ``--toy`` (passed on to the runs' processes in the environment): 2 files of 2 row groups
#: of 200 rows, one round of four cases, to check that the probe still runs.
TOY = os.environ.get("ASYNCLOADER_COLUMNAR_TOY") == "1"
FILES, GROUPS, ROWS_PER_GROUP = (2, 2, 200) if TOY else (16, 4, 2000)
TOTAL = FILES * GROUPS * ROWS_PER_GROUP
BATCH, LATENCY_S, SEQ_LEN = 256, 0.020, 2048
TOKENS = 128  # per row
DATA = Path(tempfile.gettempdir()) / f"asyncloader-columnar-probe{'-toy' if TOY else ''}"
TOY_CASES = ["pyarrow local", "ParquetSource", "JsonlSource", "Packed"]
CASES = (
    "pyarrow local",
    "datasets DataLoader 0",
    "datasets DataLoader 2",
    "datasets AsyncLoader 0",
    "datasets AsyncLoader 2 fetch_in_workers",
    "ParquetSource",
    "ParquetSource 2 fetch_in_workers",
    "ParquetSource default_collate",
    "datasets DataLoader 2 default_collate",
    "jsonl datasets DataLoader 2",
    "JsonlSource",
    "JsonlSource arrow",
    "JsonlSource arrow default_collate",
    "jsonl datasets DataLoader 2 default_collate",
    "Packed",
)


def make_data() -> None:
    """Writes the files into DATA once (kept between runs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    if (DATA / "done").exists():
        return
    DATA.mkdir(exist_ok=True)
    words = [f"w{i}" for i in range(5000)]
    for f in range(FILES):
        rng = random.Random(f)
        n = GROUPS * ROWS_PER_GROUP
        ids = list(range(f * n, (f + 1) * n))
        text = [" ".join(rng.choice(words) for _ in range(60)) for _ in ids]
        tokens = [[rng.randrange(50000) for _ in range(TOKENS)] for _ in ids]
        table = pa.table(
            {"id": ids, "text": text, "tokens": pa.array(tokens, pa.list_(pa.int32()))}
        )
        pq.write_table(table, DATA / f"part-{f:02d}.parquet", row_group_size=ROWS_PER_GROUP)
        lines = "".join(json.dumps(row) + "\n" for row in table.to_pylist()).encode()
        (DATA / f"part-{f:02d}.jsonl.zst").write_bytes(zstandard.compress(lines))
    (DATA / "done").write_text("")


def names(suffix: str) -> list[str]:
    return [f"part-{f:02d}{suffix}" for f in range(FILES)]


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def loader_for(case: str, server: Any) -> Any:
    """The iterable of batches ``case`` reads (built when called: inside the clock)."""
    from torch.utils.data import DataLoader

    from asyncloader import AsyncLoader
    from asyncloader.sources import JsonlSource, ParquetSource

    urls = [server.url(n) for n in names(".parquet")]
    fetching = {"num_workers": 2, "fetch_in_workers": True} if "fetch_in_workers" in case else {}
    opts = {"batch_size": BATCH, "collate_fn": as_list}
    if case.startswith(("datasets", "jsonl datasets")):
        import datasets

        if case.endswith("default_collate"):
            del opts["collate_fn"]
        kind, files = (
            ("json", names(".jsonl.zst")) if case.startswith("jsonl") else ("parquet", None)
        )
        files_urls = urls if files is None else [server.url(n) for n in files]
        stream = datasets.load_dataset(kind, data_files=files_urls, split="train", streaming=True)
        if "DataLoader" in case:
            words = case.split()
            return DataLoader(stream, **opts, num_workers=int(words[words.index("DataLoader") + 1]))
        return AsyncLoader(stream, **opts, **fetching)
    if case.endswith("default_collate"):
        del opts["collate_fn"]
    if case == "ParquetSource default_collate":
        return AsyncLoader(ParquetSource(urls), **opts)
    if case.startswith("ParquetSource"):
        return AsyncLoader(ParquetSource(urls), **opts, **fetching)
    if case.startswith("JsonlSource"):
        parse = "arrow" if "arrow" in case else "json"
        jsonl = [server.url(n) for n in names(".jsonl.zst")]
        return AsyncLoader(JsonlSource(jsonl, parse=parse), **opts)
    raise ValueError(case)


def pyarrow_local() -> Iterator[list[dict[str, Any]]]:
    import pyarrow.parquet as pq

    for name in names(".parquet"):
        for batch in pq.ParquetFile(DATA / name).iter_batches(batch_size=BATCH):
            yield batch.to_pylist()


def packed(server: Any) -> dict[str, Any]:
    from asyncloader import AsyncLoader
    from asyncloader.sources import Packed, ParquetSource

    urls = [server.url(n) for n in names(".parquet")]
    source = Packed(ParquetSource(urls, columns=["tokens"]), SEQ_LEN, key="tokens")
    rows = TOTAL * TOKENS // SEQ_LEN  # whole rows: the documents hold TOKENS tokens each
    every = max(1, rows // 8 // 10)  # batches between two readings of the memory
    t0, tokens, rss = time.perf_counter(), 0, []
    for k, batch in enumerate(AsyncLoader(source, batch_size=8)):
        tokens += batch["tokens"].numel()
        if k % every == every - 1:
            rss.append(own_rss_mb())
    wall = time.perf_counter() - t0
    return {
        "tokens_per_s": tokens / wall, "tokens": tokens, "wall_s": wall,
        # the training process's memory at each tenth of the epoch: flat, not growing
        "rss_tenths_mb": rss, "rss_growth_mb": rss[-1] - rss[0],
    }  # fmt: skip


def own_rss_mb() -> float:
    """This process's resident memory now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def import_libraries(case: str) -> None:
    """The libraries ``case`` reads with, imported before the clock starts (as
    :mod:`benchmarks.run_one` does): an epoch's rate, not an interpreter's start-up."""
    import pyarrow.parquet  # noqa: F401

    if case != "pyarrow local":
        import asyncloader.sources  # noqa: F401
    if "datasets" in case:
        import datasets  # noqa: F401


def one(case: str) -> dict[str, Any]:
    """One epoch of ``case`` in this process, checked."""
    from benchmarks.range_server import RangeServer

    import_libraries(case)
    with RangeServer(DATA, LATENCY_S) as server:
        if case == "Packed":
            return packed(server)
        seen = [0] * TOTAL
        t0 = time.perf_counter()
        batches = pyarrow_local() if case == "pyarrow local" else loader_for(case, server)
        for batch in batches:
            for i in batch["id"].tolist() if type(batch) is dict else (r["id"] for r in batch):
                seen[i] += 1
        wall = time.perf_counter() - t0
        if any(n != 1 for n in seen):
            raise RuntimeError(f"{case}: rows missing or repeated")
        return {"items_per_s": TOTAL / wall, "wall_s": wall, **server.stats()}


def bytes_for_id_column(last_rows: int | None = None) -> dict[str, Any]:
    """Bytes sent for ``ParquetSource(columns=["id"])`` against what it needs: the footers
    and the ``id`` chunks of the row groups holding rows it yields. With ``last_rows``, under
    ``filter=field("id") >= TOTAL - last_rows``: the other row groups' statistics rule them
    out, and the kept ones' ``id`` chunks are read twice (counted, then read)."""
    import asyncio

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from asyncloader.sources import ParquetSource
    from asyncloader.sources._columnar.parquet_file import chunk_ranges
    from benchmarks.range_server import RangeServer

    first = 0 if last_rows is None else TOTAL - last_rows
    needed = 0
    for name in names(".parquet"):
        meta = pq.read_metadata(DATA / name)
        size = os.path.getsize(DATA / name)
        needed += meta.serialized_size + 8
        for g in range(meta.num_row_groups):
            if meta.row_group(g).column(0).statistics.max >= first:
                needed += sum(len(r) for r in chunk_ranges(meta, g, [0], size))
    where = None if last_rows is None else pc.field("id") >= first
    with RangeServer(DATA, LATENCY_S) as server:
        urls = [server.url(n) for n in names(".parquet")]
        source = ParquetSource(urls, columns=["id"], filter=where)

        async def read() -> int:
            return sum([1 async for _ in source])

        rows = asyncio.run(read())
        sent = server.stats()["bytes"]
    return {"rows": rows, "bytes_sent": sent, "bytes_needed": needed, "ratio": sent / needed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=CASES)
    side_by_side.add_save_argument(parser, "columnar")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--toy", action="store_true", help="one round, tiny files")
    args = parser.parse_args()
    if args.toy and not TOY:  # again, with the toy sizes in this process and its children
        os.environ["ASYNCLOADER_COLUMNAR_TOY"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", MODULE, *sys.argv[1:]])
    if args.toy:
        args.reps, args.only = 1, args.only or TOY_CASES
    make_data()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    cases = args.only or list(CASES)
    runs = side_by_side.rounds(
        cases, args.reps, lambda c: side_by_side.in_fresh_process_sampled(
            MODULE, "--one", c, rss=True, timeout_s=600), snake=True,
    )  # fmt: skip
    keys = ("items_per_s", "tokens_per_s", "peak_rss_mb", "rss_growth_mb", "bytes")
    medians = side_by_side.medians(runs, keys)
    anchors = {
        "vs datasets DataLoader 2": side_by_side.paired(runs, "datasets DataLoader 2"),
        "vs pyarrow local": side_by_side.paired(runs, "pyarrow local"),
        "vs jsonl datasets DataLoader 2": side_by_side.paired(runs, "jsonl datasets DataLoader 2"),
        "vs datasets DataLoader 0": side_by_side.paired(runs, "datasets DataLoader 0"),
        "vs datasets DataLoader 2 default_collate": side_by_side.paired(
            runs, "datasets DataLoader 2 default_collate"
        ),
        "vs jsonl datasets DataLoader 2 default_collate": side_by_side.paired(
            runs, "jsonl datasets DataLoader 2 default_collate"
        ),
    }
    print(
        f"{TOTAL} rows, {FILES} files over HTTP, {LATENCY_S * 1e3:.0f} ms per request; "
        f"{args.reps} fresh processes per case, alternating (medians; per-round ratios)"
    )
    for case, m in medians.items():
        rate = m.get("items_per_s") or m.get("tokens_per_s")
        unit = "rows/s" if "items_per_s" in m else "tokens/s"
        ratios = [
            f"{name} {r[1]:.2f}x ({r[0]:.2f}-{r[2]:.2f})"
            for name, pairs in anchors.items()
            if (r := pairs.get(case))
        ]
        if "rss_growth_mb" in m:
            ratios.append(f"training process grew {m['rss_growth_mb']:+.0f} MB over the epoch")
        print(f"  {case:42s} {rate:10.0f} {unit:8s} rss {m['peak_rss_mb']:6.0f} MB  "
              + "; ".join(ratios))  # fmt: skip
    id_bytes = bytes_for_id_column()
    print(f"  columns=['id']: {id_bytes['bytes_sent']} bytes sent, {id_bytes['bytes_needed']} "
          f"needed (id chunks + footers): {id_bytes['ratio']:.3f}x")  # fmt: skip
    filtered = bytes_for_id_column(last_rows=TOTAL // 16)
    print(f"  columns=['id'], filter keeping the last {TOTAL // 16} rows: {filtered['rows']} "
          f"rows, {filtered['bytes_sent']} bytes sent, {filtered['bytes_needed']} needed "
          f"(footers + kept groups' id chunks): {filtered['ratio']:.3f}x")  # fmt: skip
    if args.save:
        side_by_side.save(
            args.save,
            {"rows": TOTAL, "latency_ms": LATENCY_S * 1e3, "reps": args.reps,
             "medians": medians, "paired": anchors, "id_column_bytes": id_bytes,
             "filtered_id_column_bytes": filtered},
        )  # fmt: skip


if __name__ == "__main__":
    main()
