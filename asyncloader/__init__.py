"""asyncloader: feeds PyTorch training loops faster than DataLoader when data sits behind latency.

Import everything from here::

    from asyncloader import AsyncLoader, get_worker_info
"""

from asyncloader._base import SharedList, WorkerInfo, get_worker_info
from asyncloader._tuning import Diagnosis, LoaderStats
from asyncloader.errors import (
    AsyncLoaderError,
    FetchError,
    LoaderTimeoutError,
    RemoteTraceback,
    SourceHeavyWarning,
    WorkerCrashedError,
)
from asyncloader.loader import AsyncLoader


def __getattr__(name: str) -> object:
    """``asyncloader.trace``, imported when first used (it is also ``python -m
    asyncloader.trace``, which must not find it imported already)."""
    if name == "trace":
        import importlib

        return importlib.import_module("asyncloader.trace")
    raise AttributeError(f"module 'asyncloader' has no attribute {name!r}")


__all__ = [
    "AsyncLoader",
    "AsyncLoaderError",
    "Diagnosis",
    "FetchError",
    "LoaderStats",
    "LoaderTimeoutError",
    "RemoteTraceback",
    "SharedList",
    "SourceHeavyWarning",
    "WorkerCrashedError",
    "WorkerInfo",
    "get_worker_info",
    "trace",
]
