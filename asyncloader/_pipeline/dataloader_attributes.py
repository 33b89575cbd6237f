"""DataLoader's attributes of a loader: read-only properties of its options (those DataLoader
fixes raise ``ValueError`` when assigned, as there) and the settable ``worker_init_fn``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncloader._config import Options
from asyncloader._pipeline.loader_epochs import LoaderEpochs

#: DataLoader's attributes that cannot change once the loader exists (assigning one raises
#: ValueError, as in DataLoader); the others are read-only properties too.
_FIXED = frozenset(
    {"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"}
)


class DataLoaderAttributes:
    """DataLoader's attributes, read from ``_options`` (the loader's) and ``_across`` (its
    epochs: ``num_workers`` and ``prefetch_factor`` are the current or last epoch's, else
    the first's, as ``"auto"`` moves them)."""

    _options: Options
    _across: LoaderEpochs

    dataset = property(lambda self: self._options.dataset)
    batch_size = property(lambda self: self._options.batch_size)
    drop_last = property(lambda self: self._options.drop_last)
    sampler = property(lambda self: self._options.sampler)
    batch_sampler = property(lambda self: self._options.batch_sampler)
    #: The current (or last) epoch's, else the first's: ``num_workers="auto"`` moves it.
    num_workers = property(lambda self: self._epoch_options.num_workers)
    generator = property(lambda self: self._options.generator)
    collate_fn = property(lambda self: self._options.collate)
    pin_memory = property(lambda self: self._options.pin_memory)
    pin_memory_device = property(lambda self: self._options.pin_memory_device)
    timeout = property(lambda self: self._options.timeout)
    multiprocessing_context = property(lambda self: self._options.mp_context)
    persistent_workers = property(lambda self: self._options.persistent_workers)
    in_order = property(lambda self: self._options.in_order)
    prefetch_factor = property(
        lambda self: self._across.prefetch(self._options) if self.num_workers else None
    )
    #: DataLoader's (private, but read by code written for DataLoader): samples are collated
    #: into batches by a batch sampler, as opposed to ``batch_size=None``.
    _auto_collation = property(lambda self: self._options.batch_sampler is not None)

    @property
    def worker_init_fn(self) -> Callable[[int], None] | None:
        return self._options.worker_init_fn

    @worker_init_fn.setter
    def worker_init_fn(self, fn: Callable[[int], None] | None) -> None:
        """Settable, as DataLoader's (Lightning's ``seed_everything(workers=True)`` sets it):
        epochs begun afterwards call it; started persistent workers keep the one they ran."""
        self._options = self._options.with_worker_init_fn(fn)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(name, value)

    @property
    def _epoch_options(self) -> Options:
        return self._across.options(self._options)
