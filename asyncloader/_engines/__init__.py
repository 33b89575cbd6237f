"""Engines: where a loader's batches are made. The :class:`~asyncloader._engines.engine.Engine`
seam an epoch talks to, and its local implementations: the pool of transforming workers, the
fetching workers and their channels, how worker processes start, and their lifetime across
epochs. :mod:`asyncloader._engines.ray` holds the Ray implementation behind
:class:`asyncloader.ray.RayEngine`.

Imports: :mod:`asyncloader._worker` (what the processes run), :mod:`asyncloader._tuning`,
:mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own
modules. ``ray`` is imported only under :mod:`asyncloader._engines.ray`.
"""
