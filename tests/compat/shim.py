"""The names an upstream test module's loaders are swapped for.

ASYNCLOADER_COMPAT_TARGET=asyncloader (default): ``DataLoader`` and ``StatefulDataLoader``
become AsyncLoader, under their own names (empty subclasses, so that messages worded as
DataLoader words them name the class the test instantiated, as DataLoader's do).
ASYNCLOADER_COMPAT_TARGET=upstream: they stay torch's DataLoader and torchdata's
StatefulDataLoader (the baseline).

No argument is adapted: AsyncLoader takes DataLoader's and StatefulDataLoader's signatures.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

T_co = TypeVar("T_co", covariant=True)

TARGET = os.environ.get("ASYNCLOADER_COMPAT_TARGET", "asyncloader")

if TARGET == "asyncloader":
    from asyncloader import AsyncLoader

    class DataLoader(AsyncLoader[T_co]):
        """AsyncLoader, by DataLoader's name."""

    class StatefulDataLoader(AsyncLoader[T_co]):
        """AsyncLoader, by StatefulDataLoader's name."""

    SWAP: dict[str, Any] = {"DataLoader": DataLoader, "StatefulDataLoader": StatefulDataLoader}
elif TARGET == "upstream":
    SWAP = {}  # the upstream modules keep their own names
else:
    raise ValueError(f"ASYNCLOADER_COMPAT_TARGET={TARGET!r}: expected 'asyncloader' or 'upstream'")
