"""Measurement and tuning: the per-stage meter of an epoch, the stats and the report read
from it, and the tuners of the ``"auto"`` options (the io limit, the worker count and
``prefetch``).

Imports: :mod:`asyncloader._config`, :mod:`asyncloader._base`, :mod:`asyncloader.errors` and
its own modules. The io limit's tuner also runs inside worker processes.
"""

from __future__ import annotations

from asyncloader._tuning.autosize import PrefetchTuner, WorkerTuner
from asyncloader._tuning.io_limit import FetchTuner
from asyncloader._tuning.meter import EpochMeter, now
from asyncloader._tuning.page import PageData, render_page
from asyncloader._tuning.report import Diagnosis, diagnose, render
from asyncloader._tuning.stats import LoaderStats

__all__ = [
    "Diagnosis",
    "EpochMeter",
    "FetchTuner",
    "LoaderStats",
    "PageData",
    "PrefetchTuner",
    "WorkerTuner",
    "diagnose",
    "now",
    "render",
    "render_page",
]
