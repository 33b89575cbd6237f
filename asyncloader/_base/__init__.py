"""The bottom layer: small pieces every other part of asyncloader may use.

Compatibility with private APIs (``compat``), the loader's threads, walking nested batches,
seeding, failures carried in place of batches, skipped samples, the window, the reorder
buffer, argument validation, the kinds of dataset and their own state, rank arithmetic, the
retry count, :func:`~asyncloader._base.worker_info.get_worker_info` and
:class:`~asyncloader._base.shared_list.SharedList` (records a forked worker reads without
copying).

Imports: the standard library, torch and numpy, :mod:`asyncloader.errors`, and its own
modules; nothing else of asyncloader. Sources (:mod:`asyncloader.sources`) and the core see
datasets through this layer only.
"""
