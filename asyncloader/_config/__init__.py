"""Configuration: the loader's options (one frozen dataclass, validated once, made from the
loader's arguments by ``loader_options``), the defaults of the ``"auto"`` options, and the
rank sampler that ``distributed=True`` builds.

Imports: :mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own modules.
"""

from __future__ import annotations

from asyncloader._base import remainder_len
from asyncloader._config.defaults import CAP, PREFETCH_CAP, PREFETCH_START
from asyncloader._config.loader_args import loader_options
from asyncloader._config.options import Options
from asyncloader._config.rank_sampler import TAILS, RankSampler, SamplerCut

__all__ = [
    "CAP",
    "PREFETCH_CAP",
    "PREFETCH_START",
    "TAILS",
    "Options",
    "RankSampler",
    "SamplerCut",
    "loader_options",
    "remainder_len",
]
