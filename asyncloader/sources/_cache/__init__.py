"""DiskCache: remote objects and shards kept on a local disk, shared by the node's processes.

``layout`` (where each file lives, entry keys), ``entries`` (an entry's file: written to a
temporary file and renamed, validated when read), ``locks`` (file locks: the download of an
entry, an entry in use, the cache-wide lock), ``eviction`` (the byte count and the least
recently used entries evicted), ``pins`` (entries a running epoch still needs), ``stats``
(counters shared by the node's processes), ``disk_cache`` (the public class) and ``client``
(a source's client read through the cache).

Imports: the standard library, :mod:`asyncloader.errors`, ``asyncloader._base`` and the
modules of :mod:`asyncloader.sources`; nothing else of asyncloader.
"""
