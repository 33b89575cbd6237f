"""The device stage: one thread pins batches and copies them to the device on its own stream.

``asyncloader-device`` takes batches in order from the reorder buffer, at most ``depth``
(default 2) ahead of the consumer, pins them (``pin_memory=True``) and, with ``device=`` set,
issues ``.to(device, non_blocking=True)`` on a CUDA stream it owns, so the copy of batch k+1
overlaps the training step on batch k. The hand-off must stop two races::

    asyncloader-device (side stream S)        consumer thread (its current stream C)
    ──────────────────────────────────        ──────────────────────────────────────
    src_k = pin(batch_k)
    dst_k = src_k.to(dev, non_blocking)  on S
    ev_k.record(S)          ── dst_k, ev_k ──►  C.wait_event(ev_k)       (1)
    hold src_k until ev_k has completed  (3)    dst_k.record_stream(C)   (2)
                                                step(dst_k); drop dst_k

1. Without ``wait_event`` the consumer's kernels may read ``dst_k`` before the copy on S wrote it.
2. ``dst_k`` was allocated on S, so once Python drops it the caching allocator may give its
   block to the next copy on S while kernels queued on C still read it (the corruption SPDL
   documents). ``record_stream(C)`` makes the allocator wait for C's queued work first.
3. The copy reads pinned host memory asynchronously: ``src_k`` is kept referenced until
   ``ev_k`` reports completion, so its pinned block is not reused mid-copy.

A ``device_transform`` runs on the copied batch, on the side stream before the event is
recorded, so (1)-(3) cover what it makes too.

Without CUDA the stage still runs on its thread (``device="cpu"`` copies nothing); pinning is
skipped with one warning. Custom batch types take part through their own ``pin_memory()`` and
``to(device, non_blocking=...)`` methods, as in DataLoader; tensors hidden inside them are
ordered by (1) but cannot be given (2), so keep them alive for the step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from asyncloader._base import DESCEND, map_structure, settle, tensors_of, tracing


def _apply(data: Any, on_tensor: Callable[[torch.Tensor], Any], method: str) -> Any:
    """Applies ``on_tensor`` to each tensor; objects defining ``method`` call it instead."""

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return on_tensor(x)
        if hasattr(x, method) and not isinstance(x, Mapping | Sequence):
            return on_tensor(x)
        return DESCEND

    return map_structure(data, leaf)


class OnDevice:
    """A batch copied on the side stream, with the event the consumer's stream must wait on."""

    __slots__ = ("batch", "device", "event")

    def __init__(self, batch: Any, event: Any, device: torch.device) -> None:
        self.batch = batch
        self.event = event
        self.device = device


def hand_over(item: Any) -> Any:
    """Run on the consumer's thread: makes a device batch safe on its current stream."""
    if not isinstance(item, OnDevice):
        return item
    stream = torch.cuda.current_stream(item.device)
    stream.wait_event(item.event)
    for tensor in tensors_of(item.batch):
        if tensor.is_cuda:
            tensor.record_stream(stream)
    return item.batch


class DeviceStage:
    """Owns the ``asyncloader-device`` thread and its stream.

    Args:
        pin: Pin batches (only where CUDA is available).
        device: Where to copy batches, or ``None`` to pin only.
        transform: Run on each batch after the copy (on the side stream), or ``None``.
    """

    def __init__(
        self,
        pin: bool,
        device: torch.device | None,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self._pin = pin
        self._device = device
        self._transform = transform
        self._cuda = device is not None and device.type == "cuda"
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._held: collections.deque[tuple[Any, Any]] = collections.deque()
        self._thread = threading.Thread(target=self._serve, name="asyncloader-device", daemon=True)
        self._thread.start()

    async def move(self, batch: Any) -> Any:
        """Pins and copies ``batch`` on the device thread; returns what hand_over expects
        (``done`` is settled by :meth:`_serve` for every job it takes)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._inbox.put((batch, loop, done))
        return await done

    def close(self) -> None:
        """Stops and joins the thread after the batch it is on. Idempotent; blocking."""
        self._inbox.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _serve(self) -> None:
        """Answers every job until ``None``.

        Liveness: each :meth:`move` puts its job before it awaits ``done``, and this loop
        settles ``done`` for every job it takes, with the result or the exception, also when
        the stream could not be made (the thread must not die under waiting moves); a job put
        after :meth:`close`'s ``None`` is never taken, so close only once no move waits (the
        epoch closes it after its stage tasks ended).
        """
        torch.set_num_threads(1)  # as DataLoader's pin thread: a copy must not take every core
        stream, broken = None, None
        if self._cuda:
            try:  # an invalid ordinal, a driver that fails: each batch says so
                torch.cuda.set_device(self._device)
                stream = torch.cuda.Stream(self._device)
            except Exception as e:
                broken = e
        while (job := self._inbox.get()) is not None:
            batch, loop, done = job
            try:
                if broken is not None:  # a new error each time: each batch's gets its notes
                    raise RuntimeError(f"the device thread cannot use {self._device}: {broken}")
                result, exc = self._process(batch, stream), None
            except BaseException as e:
                result, exc = None, e
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for it
                loop.call_soon_threadsafe(settle, done, result, exc)

    def _process(self, batch: Any, stream: Any) -> Any:
        if self._pin:
            with tracing.span("pin"):
                batch = _apply(batch, _pin, "pin_memory")
        device, transform = self._device, self._transform
        if device is None:
            return batch if transform is None else transform(batch)

        def to(x: Any) -> Any:
            return x.to(device, non_blocking=True)

        if stream is None:
            with tracing.span("copy"):
                out = _apply(batch, to, "to")
            return out if transform is None else transform(out)
        while self._held and self._held[0][1].query():
            self._held.popleft()  # (3): those copies are done, their sources may go
        with torch.cuda.stream(stream), tracing.span("copy (queued on the side stream)"):
            out = _apply(batch, to, "to")
            if transform is not None:
                out = transform(out)
            event = torch.cuda.Event()
            event.record(stream)
        self._held.append((batch, event))
        return OnDevice(out, event, device)


def _pin(x: Any) -> Any:
    return x.pin_memory()
