"""ShardedSource: WebDataset-style tar shards read as one async iterable source.

Offers :class:`~asyncloader.sources._sharded.source.ShardedSource` (``source``), the only
name the rest of :mod:`asyncloader.sources` uses. Inside: ``options`` (the constructor's
arguments checked, the client of the URLs' scheme), ``shardplan`` (an epoch's shards split
across ranks and workers), ``remainder`` (what an interrupted epoch had left, split again),
``interleave`` (the fixed round robin over a stream's slices), ``stream`` (one pass over a
rank's slices, with its shuffle buffer), ``reading`` (one slice of a shard read, decoded,
skipped; shards counted) and ``tar`` (tar members read from a stream).

Imports: the standard library, :mod:`asyncloader.errors`, ``asyncloader._base`` and the
modules of :mod:`asyncloader.sources`; nothing else of asyncloader.
"""
