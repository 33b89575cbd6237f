"""The names an upstream test module's loaders are swapped for.

ASYNCLOADER_COMPAT_TARGET=asyncloader (default): ``DataLoader`` and ``StatefulDataLoader``
become AsyncLoader, under their own names (empty subclasses, so that messages worded as
DataLoader words them name the class the test instantiated, as DataLoader's do).
ASYNCLOADER_COMPAT_TARGET=upstream: they stay torch's DataLoader and torchdata's
StatefulDataLoader (the baseline).

AsyncLoader takes DataLoader's and StatefulDataLoader's signatures. One argument is added: an
``IterableDataset`` with workers gets ``fetch_in_workers=True``, DataLoader's placement for it
(each worker iterates its own copy), which AsyncLoader keeps opt-in (docs/compatibility.md).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

T_co = TypeVar("T_co", covariant=True)

TARGET = os.environ.get("ASYNCLOADER_COMPAT_TARGET", "asyncloader")

if TARGET == "asyncloader":
    from torch.utils.data import IterableDataset

    from asyncloader import AsyncLoader

    class _DataLoaderPlacement(AsyncLoader[T_co]):
        """AsyncLoader, iterating an IterableDataset in each worker as DataLoader does."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            dataset = args[0] if args else kwargs.get("dataset")
            workers = args[5] if len(args) > 5 else kwargs.get("num_workers", 0)
            if isinstance(dataset, IterableDataset) and workers:
                kwargs.setdefault("fetch_in_workers", True)
            super().__init__(*args, **kwargs)

    class DataLoader(_DataLoaderPlacement[T_co]):
        """AsyncLoader, by DataLoader's name."""

    class StatefulDataLoader(_DataLoaderPlacement[T_co]):
        """AsyncLoader, by StatefulDataLoader's name."""

    SWAP: dict[str, Any] = {"DataLoader": DataLoader, "StatefulDataLoader": StatefulDataLoader}
elif TARGET == "upstream":
    SWAP = {}  # the upstream modules keep their own names
else:
    raise ValueError(f"ASYNCLOADER_COMPAT_TARGET={TARGET!r}: expected 'asyncloader' or 'upstream'")
