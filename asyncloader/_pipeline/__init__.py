"""The pipeline of one epoch in the training process: its start (decided at ``iter()``), the
running epoch's stages in one TaskGroup (batch numbering, the fetch, the transform through an
engine, iterable sources run in the workers, the reorder buffer, the device stage), and the
sync and async iterators the consumer holds.

Imports: every private layer below it (:mod:`asyncloader._engines`,
:mod:`asyncloader._checkpoint`, :mod:`asyncloader._worker`, :mod:`asyncloader._tuning`,
:mod:`asyncloader._config`, :mod:`asyncloader._base`), :mod:`asyncloader.errors` and its own
modules.
"""
