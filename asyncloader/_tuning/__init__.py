"""Measurement and tuning: the per-stage meter of an epoch, the stats and the report read
from it, and the tuners of the ``"auto"`` options (the io limit, the worker count and
``prefetch``).

Imports: :mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and
its own modules. The io limit's tuner also runs inside worker processes.
"""
