"""A loader's arguments made its :class:`~asyncloader._config.options.Options`: DataLoader's
spellings of an option resolved to asyncloader's, and the arguments accepted only for
DataLoader's (or ``StatefulDataLoader``'s) signature checked."""

from __future__ import annotations

from typing import Any

from asyncloader._base import check_int, dataloader_spellings
from asyncloader._config.options import Options


def loader_options(
    loader_name: str,
    *,
    prefetch_factor: int | None,
    multiprocessing_context: Any,
    snapshot_every_n_steps: int,
    **fields: Any,
) -> Options:
    """The options of a loader named ``loader_name``: ``fields`` are :class:`Options`' own
    (``num_workers`` and ``prefetch`` may be ``"auto"``: Options resolves them to ints);
    ``prefetch_factor`` and ``multiprocessing_context`` are DataLoader's names for
    ``prefetch`` and ``mp_context`` (one name per option).

    Raises:
        TypeError, ValueError: As :class:`Options` does, or an option given by both its names,
            or ``snapshot_every_n_steps`` not an int >= 0.
    """
    fields["prefetch"], fields["mp_context"] = dataloader_spellings(
        fields["num_workers"],
        fields["prefetch"],
        prefetch_factor,
        fields["mp_context"],
        multiprocessing_context,
    )
    check_int("snapshot_every_n_steps", snapshot_every_n_steps, 0)
    return Options(**fields, loader_name=loader_name)
