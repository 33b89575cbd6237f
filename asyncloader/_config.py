"""Validates AsyncLoader's arguments (eagerly, with DataLoader's rules) and builds the sampling.

Everything a run needs is fixed here, in the constructor, so a mistake fails at the line that
made it rather than at the first batch.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from asyncloader.sources import SourceKind, source_kind

DEVICE_DEPTH = 2


@dataclass(frozen=True, slots=True)
class Config:
    """The validated options of one loader (see AsyncLoader for their meaning)."""

    dataset: Any
    kind: SourceKind
    batch_size: int | None
    drop_last: bool
    sampler: Any  # Sampler for map-style sources, None for iterables
    batch_sampler: Any  # yields lists of indices; None when not batching or iterable
    collate: Callable[[Any], Any]
    transform: Callable[[Any], Any] | None
    num_workers: int
    executor: Executor | None
    io_concurrency: int
    prefetch: int
    in_order: bool
    pin_memory: bool
    device: torch.device | None
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    persistent_workers: bool
    mp_context: Any
    generator: torch.Generator | None
    seed_per_sample: bool

    @property
    def batched(self) -> bool:
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def fetch_in_workers(self) -> bool:
        """A sync map-style source is read inside asyncloader's own worker processes."""
        return self.kind is SourceKind.MAP and self.num_workers > 0

    @property
    def transform_window(self) -> int:
        """Batches at most in the executor at once: ``prefetch`` per worker."""
        return self.prefetch * max(1, self.num_workers)

    @property
    def fetch_window(self) -> int:
        """Batches at most being fetched on the loop: enough to keep io_concurrency busy."""
        if self.fetch_in_workers:
            return 0
        if not self.kind.is_map:
            return 1
        per_batch = self.batch_size or 1
        if self.batch_sampler is not None and self.batch_size is None:
            per_batch = getattr(self.batch_sampler, "batch_size", None) or 1
        return math.ceil(self.io_concurrency / per_batch)

    @property
    def device_depth(self) -> int:
        """Batches at most pinned or copied ahead of the consumer by the device thread."""
        return DEVICE_DEPTH if self.device_stage else 0

    @property
    def device_stage(self) -> bool:
        """Batches go through the ``asyncloader-device`` thread (to pin or to copy)."""
        return self.device is not None or (self.pin_memory and torch.cuda.is_available())

    @property
    def window(self) -> int:
        """Batches at most taken from the sampler and not yet handed to the consumer."""
        return self.transform_window + self.fetch_window + self.device_depth


def _check_callable(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__qualname__}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__qualname__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")


def _resolve_mp_context(mp_context: Any, num_workers: int) -> Any:
    if mp_context is None:
        return None
    if num_workers == 0:
        raise ValueError(
            "mp_context can only be used with multi-process loading (num_workers > 0), "
            f"but got {num_workers=}"
        )
    if isinstance(mp_context, str):
        valid = multiprocessing.get_all_start_methods()
        if mp_context not in valid:
            raise ValueError(f"mp_context={mp_context!r} must be one of {valid}")
        return multiprocessing.get_context(mp_context)
    if not isinstance(mp_context, multiprocessing.context.BaseContext):
        raise TypeError(
            "mp_context must be a start method name or a multiprocessing context, "
            f"got {type(mp_context).__qualname__}"
        )
    return mp_context


def _resolve_device(device: str | torch.device | None, pin_memory: bool) -> torch.device | None:
    """Checks that ``device`` exists here; warns once when pinning is impossible."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but CUDA is not available on this machine")
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True but CUDA is not available: batches are passed through unpinned",
            UserWarning,
            stacklevel=4,
        )
    return device


def fork_is_safe() -> bool:
    """Forking now is as safe as DataLoader's own fork: Linux, from the main thread, and no
    other Python thread alive (a thread holding a lock at fork time can deadlock the child)."""
    return (
        sys.platform == "linux"
        and threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
    )


def default_mp_context() -> Any:
    """The start method used when workers cannot be forked safely (see :func:`fork_is_safe`).

    forkserver on Linux: the fork server preloads asyncloader (and so torch) and the main module
    once, so each worker starts as a fork of an already-initialised, single-threaded process.
    spawn elsewhere.
    """
    if sys.platform == "linux":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", "asyncloader._worker"])
        return ctx
    return multiprocessing.get_context("spawn")


def build_config(dataset: Any, **opts: Any) -> Config:
    """Checks every option and derives the sampler chain. See AsyncLoader for the options."""
    kind = source_kind(dataset)
    batch_size = opts["batch_size"]
    shuffle, sampler, batch_sampler = opts["shuffle"], opts["sampler"], opts["batch_sampler"]
    drop_last, generator = opts["drop_last"], opts["generator"]
    num_workers, timeout, executor = opts["num_workers"], opts["timeout"], opts["executor"]

    _check_int("num_workers", num_workers, 0)
    _check_int("io_concurrency", opts["io_concurrency"], 1)
    _check_int("prefetch", opts["prefetch"], 1)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__qualname__}")
    if timeout < 0:
        raise ValueError(f"timeout option should be non-negative, got {timeout=}")
    for name in ("collate_fn", "transform", "worker_init_fn"):
        _check_callable(name, opts[name])
    if executor is not None:
        if not isinstance(executor, Executor):
            raise TypeError(
                f"executor must be a concurrent.futures.Executor, got {type(executor).__qualname__}"
            )
        if num_workers:
            raise ValueError(
                f"executor and num_workers={num_workers} are exclusive: num_workers starts "
                "asyncloader's own pool; with executor=, size the window with prefetch"
            )
    if opts["persistent_workers"] and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__qualname__}")
    device = opts["device"]
    if device is not None and not isinstance(device, str | torch.device):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__qualname__}")
    device = _resolve_device(device, bool(opts["pin_memory"]))
    mp_context = _resolve_mp_context(opts["mp_context"], num_workers)
    if batch_size is not None:
        _check_int("batch_size", batch_size, 1)

    if kind.is_map:
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        if sampler is None:
            sampler = (
                RandomSampler(dataset, generator=generator)
                if shuffle
                else SequentialSampler(dataset)
            )
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    else:
        for name, value in (("shuffle", shuffle), ("sampler", sampler)):
            if value:
                raise ValueError(
                    f"an iterable dataset has no indices: expected unspecified {name} option, "
                    f"but got {name}={value!r}"
                )
        if batch_sampler is not None:
            raise ValueError(
                "an iterable dataset has no indices: expected unspecified batch_sampler option, "
                f"but got batch_sampler={batch_sampler!r}"
            )
        if batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
    batched = batch_size is not None or batch_sampler is not None
    collate = opts["collate_fn"] or (default_collate if batched else default_convert)
    return Config(
        dataset=dataset,
        kind=kind,
        batch_size=batch_size,
        drop_last=bool(drop_last),
        sampler=sampler,
        batch_sampler=batch_sampler,
        collate=collate,
        transform=opts["transform"],
        num_workers=num_workers,
        executor=executor,
        io_concurrency=opts["io_concurrency"],
        prefetch=opts["prefetch"],
        in_order=bool(opts["in_order"]),
        pin_memory=bool(opts["pin_memory"]),
        device=device,
        timeout=float(timeout),
        worker_init_fn=opts["worker_init_fn"],
        persistent_workers=bool(opts["persistent_workers"]),
        mp_context=mp_context,
        generator=generator,
        seed_per_sample=bool(opts["seed_per_sample"]),
    )
