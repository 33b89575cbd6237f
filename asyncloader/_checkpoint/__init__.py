"""Checkpoints: the state format (what the consumer has seen, versioned; its shape and its fit
to the loader checked before any of it is used), where a source's own state sits in it
(StatefulDataLoader's layout), and the progress record of a running epoch that
``state_dict()`` reads.

Imports: :mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and
its own modules. Nothing inside a worker process imports it.
"""
