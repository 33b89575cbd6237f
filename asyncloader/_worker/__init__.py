"""What runs inside a worker process: its start-up and identity, the orphan watchdog, the
allocator's treatment of batch memory, the plan a batch is made by (fetch, transform,
collate), the fetch on the worker's own event loop, the transport of finished batches, the
messages exchanged with the training process, and the fetching worker's loop.

Imports: :mod:`asyncloader._tuning` (the io limit's tuner runs here), :mod:`asyncloader._config`,
:mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own modules; never code of the
training process's side (checkpoints, engines, the pipeline), nor :mod:`asyncloader.sources`.
"""
