"""Sources: what a dataset may be, and ready-made local, HTTP, object-store and sharded sources.

Each source here is usable directly as the loader's dataset::

    from asyncloader.sources import HTTPSource, ObjectStoreSource, FileSource, ShardedSource
    from asyncloader.sources import ParquetSource, JsonlSource, Packed, Mix, DiskCache
"""

from asyncloader._base import AsyncMapSource, MapSource, SourceKind, source_kind
from asyncloader.sources._cache.disk_cache import DiskCache
from asyncloader.sources._columnar.jsonl import JsonlSource
from asyncloader.sources._columnar.parquet import ParquetSource
from asyncloader.sources._files import FileSource
from asyncloader.sources._http import HTTPSource
from asyncloader.sources._mix.mix import Mix
from asyncloader.sources._objectstore import ObjectStoreSource
from asyncloader.sources._retry import Retry
from asyncloader.sources._sharded.source import ShardedSource
from asyncloader.sources._skips import Skipped, drop_skipped, pass_skipped
from asyncloader.sources._tokens.packed import Packed

__all__ = [
    "AsyncMapSource",
    "DiskCache",
    "FileSource",
    "HTTPSource",
    "JsonlSource",
    "MapSource",
    "Mix",
    "ObjectStoreSource",
    "Packed",
    "ParquetSource",
    "Retry",
    "ShardedSource",
    "Skipped",
    "SourceKind",
    "drop_skipped",
    "pass_skipped",
    "source_kind",
]
