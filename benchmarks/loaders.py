"""Each loader, set up for each workload the way its own documentation recommends.

- ``DataLoader``: the dataset's blocking ``__getitem__`` in ``num_workers`` processes (one
  request in flight each), ``default_collate`` in the workers, defaults otherwise.
- ``torchdata.nodes``, as in its "migrating from DataLoader" guide: ``SamplerWrapper`` ->
  ``ParallelMapper(__getitem__)`` (``method="thread"`` with one thread per request in flight
  for io/http, ``method="process"`` with 2 processes for CPU work) -> ``Batcher`` ->
  ``Mapper(default_collate)`` -> ``Prefetcher`` -> ``Loader``.
- ``spdl``: ``PipelineBuilder`` with an async ``pipe`` of ``concurrency`` requests for io/http,
  and for CPU work a ``pipe`` on a ``ProcessPoolExecutor(2)`` (its "multi-processing (stage)"
  pattern, 2 tasks a worker so neither waits on the loop), then ``aggregate`` and a collate
  ``pipe``; default (completion) output order.
- ``asyncloader``: ``async def __getitem__`` with ``io_concurrency`` for io/http and no
  processes; ``num_workers=2`` for CPU work (the dataset read, ``transform`` and collate fused
  in the workers).

Every builder is a context manager yielding an iterable of batches and closing on exit.
Each library is imported by :func:`import_library` before the clock starts, as DataLoader is:
an import is paid once per process, not per loader, and is not what the benchmark compares.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from torch.utils.data import DataLoader, SequentialSampler, default_collate

from benchmarks.workloads import (
    AsyncHttpSource,
    AsyncSleepSource,
    BigSource,
    BurnedSource,
    HttpSource,
    IndexSource,
    MemorySource,
    SleepSource,
    Workload,
    burn,
)

LOADERS = ("DataLoader", "torchdata", "spdl", "asyncloader")
CPU_WORKERS = 2
PREFETCH = 2


def import_library(loader: str) -> None:
    """Imports ``loader``'s library (run before the clock starts; see the module docstring)."""
    module = {
        "DataLoader": "torch.utils.data",
        "torchdata": "torchdata.nodes",
        "spdl": "spdl.pipeline",
        "asyncloader": "asyncloader",
    }[loader]
    importlib.import_module(module)


def blocking_source(workload: Workload, n: int, port: int | None) -> Any:
    """The dataset for loaders that block in ``__getitem__`` (cpu work fused in)."""
    match workload.name:
        case "io":
            return SleepSource(n)
        case "http":
            assert port is not None
            return HttpSource(n, port)
        case "cpu":
            return BurnedSource(n)
        case "big":
            return BigSource(n)
        case "overhead":
            return IndexSource(n)
    raise ValueError(workload.name)


def async_source(workload: Workload, n: int, port: int | None) -> Any:
    """The dataset for loaders that await IO on an event loop (io and http only)."""
    if workload.name == "io":
        return AsyncSleepSource(n)
    assert workload.name == "http" and port is not None
    return AsyncHttpSource(n, port)


def make_dataset(loader: str, workload: Workload, n: int, port: int | None) -> Any:
    """The dataset ``loader`` reads for ``workload``; made before the clock starts."""
    if workload.latency_bound and loader in ("spdl", "asyncloader"):
        return async_source(workload, n, port)
    if workload.name == "cpu" and loader == "asyncloader":
        return MemorySource(n)  # burn runs as its transform=
    return blocking_source(workload, n, port)


@contextlib.contextmanager
def dataloader(workload: Workload, dataset: Any, setting: int) -> Iterator[Any]:
    """``setting`` is num_workers."""
    with iterating(DataLoader(dataset, batch_size=workload.batch, num_workers=setting)) as it:
        yield it


@contextlib.contextmanager
def iterating(loader: DataLoader) -> Iterator[Any]:
    """An iterator of ``loader`` whose workers are shut down when the block ends (DataLoader
    has no close(); its iterator's ``_shutdown_workers`` is what its own ``__del__`` calls)."""
    it = iter(loader)
    try:
        yield it
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


@contextlib.contextmanager
def torchdata_nodes(workload: Workload, dataset: Any, setting: int) -> Iterator[Any]:
    """``setting`` is the ParallelMapper's num_workers (threads for io/http, else processes)."""
    import torchdata.nodes as tn

    node: Any = tn.SamplerWrapper(SequentialSampler(dataset))
    node = mapper = tn.ParallelMapper(
        node,
        map_fn=dataset.__getitem__,
        num_workers=setting,
        method="thread" if workload.latency_bound else "process",
    )
    node = tn.Batcher(node, batch_size=workload.batch, drop_last=False)
    node = tn.Mapper(node, default_collate)
    prefetcher = tn.Prefetcher(node, prefetch_factor=PREFETCH)
    it = iter(tn.Loader(prefetcher))
    try:
        yield it
    finally:
        # Stop and join the threads (and processes) now, as their __del__ would, so that none
        # outlives the run into interpreter shutdown.
        for owner in (prefetcher, mapper):
            inner = getattr(owner, "_it", None)
            while inner is not None and not hasattr(inner, "_shutdown"):
                inner = getattr(inner, "_it", None)
            if inner is not None:
                inner._shutdown()


_installed: Any = None


def _install(dataset: Any) -> None:
    """ProcessPoolExecutor initializer: keeps this worker's copy of the dataset."""
    global _installed
    _installed = dataset


def _installed_getitem(index: int) -> Any:
    """The per-item task of SPDL's process stage: one index in, one sample out."""
    return _installed[index]


@contextlib.contextmanager
def spdl_pipeline(workload: Workload, dataset: Any, setting: int) -> Iterator[Any]:
    """``setting`` is the async stage's concurrency (io/http) or the process-pool size."""
    from spdl.pipeline import PipelineBuilder

    builder = PipelineBuilder().add_source(range(len(dataset)))
    pool = None
    if workload.latency_bound:
        builder.pipe(dataset.__getitem__, concurrency=setting)
    else:
        # The dataset reaches each worker once (initializer), not pickled with every task.
        pool = ProcessPoolExecutor(max_workers=setting, initializer=_install, initargs=(dataset,))
        builder.pipe(_installed_getitem, executor=pool, concurrency=2 * setting)
    builder.aggregate(workload.batch).pipe(default_collate).add_sink(PREFETCH + 1)
    pipeline = builder.build(num_threads=CPU_WORKERS)
    try:
        with pipeline.auto_stop():
            yield pipeline.get_iterator(timeout=300)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def asyncloader_options(workload: Workload, setting: int) -> dict[str, Any]:
    """AsyncLoader's options for ``workload``: ``setting`` is io_concurrency (io/http, no
    processes) or num_workers."""
    if workload.latency_bound:
        return {"batch_size": workload.batch, "io_concurrency": setting}
    if workload.name == "cpu":
        return {"batch_size": workload.batch, "transform": burn, "num_workers": setting}
    return {"batch_size": workload.batch, "num_workers": setting}


@contextlib.contextmanager
def asyncloader_loader(
    workload: Workload, dataset: Any, setting: int, **options: Any
) -> Iterator[Any]:
    """:func:`asyncloader_options`, with ``options`` (other AsyncLoader options) added."""
    from asyncloader import AsyncLoader

    loader = AsyncLoader(dataset, **asyncloader_options(workload, setting), **options)
    with loader, contextlib.closing(iter(loader)) as it:
        yield it


BUILDERS = {
    "DataLoader": dataloader,
    "torchdata": torchdata_nodes,
    "spdl": spdl_pipeline,
    "asyncloader": asyncloader_loader,
}
