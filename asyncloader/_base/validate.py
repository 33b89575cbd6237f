"""The checks of AsyncLoader's arguments: each a few lines, each raising DataLoader's exception
type where DataLoader has the argument, with a message that names it.

Called once, from :class:`asyncloader._config.options.Options`, in the constructor: a mistake fails
at
the line that made it rather than at the first batch.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import Executor
from typing import Any

import torch

from asyncloader._base.compat import is_mp_context, warn_at_caller


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__qualname__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")


def is_auto(name: str, value: Any) -> bool:
    """``value`` is ``"auto"``; any other str is a TypeError naming the option (an int or
    ``"auto"`` is what it takes)."""
    if not isinstance(value, str):
        return False
    if value != "auto":
        raise TypeError(f"{name} must be an int or 'auto', got {value!r}")
    return True


def check_callable(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__qualname__}")


def check_instance(name: str, value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """``value`` is None or a ``kind``; else TypeError: ``{name} must be {what}``."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, got {type(value).__qualname__}")


def check_timeout(timeout: Any) -> None:
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__qualname__}")
    if timeout < 0:
        raise ValueError(f"timeout option should be non-negative, got {timeout=}")


#: The environment variable that turns the stall dump on (``_pipeline.stall_dump``): seconds.
STALL_DUMP_ENV = "ASYNCLOADER_STALL_DUMP"


def stall_dump_seconds(raw: str | None) -> float | None:
    """The seconds of :data:`STALL_DUMP_ENV` (its value ``raw``); ``None`` (off) when unset or
    empty. Anything but a finite number above 0 is a ValueError naming the variable."""
    if raw is None or not raw.strip():
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{STALL_DUMP_ENV}={raw!r} must be a number of seconds > 0")
    return seconds


def check_num_workers(num_workers: Any) -> None:
    """An int >= 0; a negative one gets DataLoader's message."""
    if isinstance(num_workers, int) and num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing (got num_workers={num_workers})"
        )
    check_int("num_workers", num_workers, 0)


def check_workers(
    num_workers: int, executor: Any, persistent_workers: bool, auto: bool = False
) -> None:
    """``auto``: ``num_workers="auto"`` (its count may be 0 now and grow later)."""
    check_instance("executor", executor, Executor, "a concurrent.futures.Executor")
    if executor is not None and (num_workers or auto):
        shown = "'auto'" if auto else num_workers
        raise ValueError(
            f"executor and num_workers={shown} are exclusive: num_workers starts "
            "asyncloader's own pool; with executor=, size the window with prefetch"
        )
    if persistent_workers and num_workers == 0 and not auto:
        raise ValueError("persistent_workers option needs num_workers > 0")


def check_engine(engine: Any, num_workers: Any, executor: Any) -> None:
    if not callable(getattr(engine, "bind", None)) or not hasattr(engine, "num_workers"):
        raise TypeError(
            f"engine must be a worker engine such as asyncloader.ray.RayEngine, got "
            f"{type(engine).__qualname__}"
        )
    if executor is not None:
        raise ValueError("engine and executor are exclusive: each says where batches are made")
    if num_workers not in (0, engine.num_workers):
        raise ValueError(
            f"num_workers={num_workers} and engine={engine!r} disagree: the engine's "
            "num_workers is the loader's (leave num_workers out)"
        )


def check_fetch_in_workers(fetch_in_workers: Any, num_workers: int) -> None:
    check_instance("fetch_in_workers", fetch_in_workers, bool, "a bool")
    if fetch_in_workers and num_workers == 0:
        raise ValueError(
            "fetch_in_workers=True needs num_workers > 0: it moves fetching into the workers"
        )


def dataloader_spellings(
    num_workers: Any,
    prefetch: int | str | None,
    prefetch_factor: int | str | None,
    mp_context: Any,
    multiprocessing_context: Any,
) -> tuple[int | str, Any]:
    """``(prefetch, mp_context)`` from asyncloader's and DataLoader's names for them
    (``prefetch`` given by neither: ``"auto"``, the default).

    ``prefetch_factor`` keeps DataLoader's rule (only with workers); ``prefetch`` (batches per
    worker, or per executor without workers) works everywhere. One name per option.
    """
    if prefetch is not None and prefetch_factor is not None:
        raise TypeError("prefetch and prefetch_factor name one option: pass one of them")
    if mp_context is not None and multiprocessing_context is not None:
        raise TypeError("mp_context and multiprocessing_context name one option: pass one of them")
    if prefetch_factor is not None:
        if num_workers == 0:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing. "
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                "to None."
            )
        if not is_auto("prefetch_factor", prefetch_factor):
            check_int("prefetch_factor", prefetch_factor, 1)
        prefetch = prefetch_factor
    context = mp_context if mp_context is not None else multiprocessing_context
    return ("auto" if prefetch is None else prefetch), context


def available_cores() -> int | None:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def warn_many_workers(loader: str, num_workers: Any) -> None:
    """DataLoader's warning when more workers than cores are asked for (``"auto"`` never
    asks for more)."""
    cores = available_cores()
    if isinstance(num_workers, int) and num_workers > 0 and (cores is None or num_workers > cores):
        warn_at_caller(
            f"This {loader} will create {num_workers} worker processes in total, and this "
            f"process may use {cores or 'an unknown number of'} cores. Please be aware that "
            "excessive worker creation might get DataLoader running slow or even freeze (the "
            "same holds for AsyncLoader): lower num_workers if necessary."
        )


def resolve_mp_context(mp_context: Any, num_workers: int, auto: bool = False) -> Any:
    """The multiprocessing context named by ``mp_context`` (None: chosen per epoch), with
    DataLoader's checks of ``multiprocessing_context`` (``auto``: ``num_workers="auto"``)."""
    if mp_context is None:
        return None
    if num_workers == 0 and not auto:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    if isinstance(mp_context, str):
        valid = multiprocessing.get_all_start_methods()
        if mp_context not in valid:
            raise ValueError(
                f"multiprocessing_context option should specify a valid start method in "
                f"{valid!r}, but got multiprocessing_context={mp_context!r}"
            )
        return multiprocessing.get_context(mp_context)
    if not is_mp_context(mp_context):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={mp_context}"
        )
    return mp_context


def resolve_device(device: Any, pin_memory: bool) -> torch.device | None:
    """Checks that ``device`` exists here; warns once when pinning is impossible."""
    check_instance("device", device, (str, torch.device), "a str or torch.device")
    resolved = None if device is None else torch.device(device)
    if resolved is not None and resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(resolved)!r} but CUDA is not available on this machine")
    if pin_memory and not torch.cuda.is_available():
        warn_at_caller(
            "pin_memory=True but CUDA is not available: batches are passed through unpinned"
        )
    return resolved


def check_no_indices(loader: str, name: str, value: Any) -> None:
    """An iterable dataset has no indices to sample: ``name`` must be left unset."""
    if value:
        raise ValueError(
            f"{loader} with IterableDataset: expected unspecified {name} option, but got "
            f"{name}={value!r} (an iterable dataset has no indices to sample)"
        )


def check_auto_batching(batch_size: int | None, drop_last: bool) -> None:
    if batch_size is None and drop_last:
        raise ValueError(
            "batch_size=None option disables auto-batching and is mutually exclusive with drop_last"
        )


def check_on_error(on_error: Any, max_skipped: Any, budget: str = "per epoch") -> None:
    """``on_error`` is ``"raise"`` or ``"skip"``; ``"skip"`` needs a budget, ``"raise"`` none.
    ``budget`` says what ``max_skipped`` counts over, in the message."""
    if not isinstance(on_error, str):
        raise TypeError(f"on_error must be 'raise' or 'skip', got {type(on_error).__qualname__}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
    if on_error == "skip":
        if max_skipped is None:
            raise ValueError(
                f"on_error='skip' needs max_skipped=N, the most samples to skip {budget} "
                "before a bad sample fails"
            )
        check_int("max_skipped", max_skipped, 1)
    elif max_skipped is not None:
        raise ValueError(f"max_skipped={max_skipped!r} is only meaningful with on_error='skip'")


def check_map_sampling(
    batch_size: int | None, shuffle: Any, sampler: Any, batch_sampler: Any, drop_last: bool
) -> None:
    """DataLoader's exclusions between the sampling options of a map-style dataset."""
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                "sampler, and drop_last"
            )
    else:
        check_auto_batching(batch_size, drop_last)
