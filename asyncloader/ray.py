"""Workers on a Ray cluster: ``AsyncLoader(dataset, ..., engine=RayEngine(num_workers=N))``.

Each worker is a Ray actor running the same pipeline as a local ``fetch_in_workers=True``
worker (:class:`asyncloader._worker.loop.WorkerCore` on the actor's event loop): it fetches,
transforms and collates the batches it is given, or iterates its own copy of an iterable
source. The dataset, ``transform`` and ``collate_fn`` reach each actor once, when it starts;
a request carries only indices.

How requests and answers travel depends on where the actors run. When every actor is on the
training process's node (and ``local_sockets``, the default), each connects to a Unix socket
of the training process and serves it as a local worker serves its pipe
(:mod:`asyncloader._engines.ray.sockets`): no Ray call and no object store per batch. Otherwise
requests and answers travel several to a Ray call, a batch's answer as soon as it is ready
(see :class:`LongPoll`), and batches come back through Ray's object store; numpy arrays
there are read-only views of the store, so they are copied once on arrival (the batch you get
is writable and never aliases the store; tensors arrive as copies already). Either way the
batch you get is writable and your own.

The actors run on whatever nodes the connected cluster has: ``ray.init(address=...)`` first,
or a local cluster is started on first use. Ray is an optional extra (``pip install
asyncloader[ray]``), imported only by this module and the modules of
:mod:`asyncloader._engines.ray` behind it.

An actor that dies mid-epoch raises :class:`~asyncloader.errors.WorkerCrashedError`, as a
local worker does. With Ray's own ``max_restarts`` and ``max_task_retries`` actor options
(then requests always travel through Ray, wherever the actors run),
Ray restarts it and retries its outstanding calls instead, and the restarted actor is sent
every request the lost one held: each batch is still delivered once (an actor runs a request
once by its number, the training process takes one answer per request, and a retry makes the
same batch). A worker iterating its own copy of an iterable source cannot be restarted in
place (its position is gone): the epoch then raises ``WorkerCrashedError``, and resuming from
``state_dict()`` continues it.
"""

from __future__ import annotations

from typing import Any

try:
    import ray  # noqa: F401  (here, so that a missing extra names itself)
except ImportError as exc:
    raise ImportError("asyncloader.ray needs Ray: pip install 'asyncloader[ray]'") from exc

from asyncloader._config import Options
from asyncloader._engines.ray import RayWorkers
from asyncloader._worker import BatchPlan

__all__ = ["RayEngine"]


class RayEngine:
    """Runs a loader's workers as Ray actors (see the module docstring).

    Args:
        num_workers: Actors to start (each ``num_cpus=1`` unless ``actor_options`` say
            otherwise). The loader's ``num_workers`` is this; ``io_concurrency`` is the total
            in flight across them.
        actor_options: Passed to ``ActorClass.options()``: ``num_cpus``, ``resources``,
            ``scheduling_strategy``, ``runtime_env``, ``max_restarts`` and
            ``max_task_retries``... Without a ``runtime_env`` the actors get this process's
            ``sys.path`` as ``PYTHONPATH``, so a dataset class defined beside your script
            unpickles on a local cluster; on a remote one, install your code on the nodes or
            ship it with ``runtime_env``.
        local_sockets: When every actor runs on this process's node, they answer over Unix
            sockets rather than through Ray's calls and object store (``False``: always
            through Ray). Ignored with ``max_restarts``, which needs Ray's path.

    Use ``persistent_workers=True`` with it: actors take seconds to start, and otherwise each
    epoch starts its own.
    """

    def __init__(
        self, num_workers: int = 2, *, local_sockets: bool = True, **actor_options: Any
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        if not isinstance(local_sockets, bool):
            raise TypeError(f"local_sockets must be a bool, got {local_sockets!r}")
        self.num_workers = num_workers
        self.local_sockets = local_sockets
        self.actor_options = actor_options

    def bind(self, options: Options, plan: BatchPlan, base_seed: int) -> RayWorkers:
        """The actors of one loader's epoch (or of all its epochs, with persistent workers)."""
        return RayWorkers(self, options, plan, base_seed)

    def __repr__(self) -> str:
        return (
            f"RayEngine(num_workers={self.num_workers}, local_sockets={self.local_sockets}, "
            f"**{self.actor_options!r})"
        )
