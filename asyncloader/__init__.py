"""asyncloader: feeds PyTorch training loops faster than DataLoader when data sits behind latency.

Import everything from here::

    from asyncloader import AsyncLoader, get_worker_info
"""

from asyncloader._base.shared_list import SharedList
from asyncloader._base.worker_info import WorkerInfo, get_worker_info
from asyncloader._tuning.report import Diagnosis
from asyncloader._tuning.stats import LoaderStats
from asyncloader.errors import (
    AsyncLoaderError,
    FetchError,
    LoaderTimeoutError,
    RemoteTraceback,
    SourceHeavyWarning,
    WorkerCrashedError,
)
from asyncloader.loader import AsyncLoader

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
]
