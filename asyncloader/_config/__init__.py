"""Configuration: the loader's options (one frozen dataclass, validated once), the defaults
of the ``"auto"`` options, and the rank sampler that ``distributed=True`` builds.

Imports: :mod:`asyncloader._base`, :mod:`asyncloader.errors` and its own modules.
"""
