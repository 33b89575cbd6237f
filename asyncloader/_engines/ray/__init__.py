"""Workers as Ray actors, behind :class:`asyncloader.ray.RayEngine`: the actor, the long poll
through Ray's calls, the Unix sockets used when the actors share the training process's node,
and the group of running actors.

Imports: ``ray``, the rest of :mod:`asyncloader._engines`, and the layers below it. Importing
this package's modules imports ``ray`` (an optional extra); nothing imports them but
:mod:`asyncloader.ray`.
"""

from __future__ import annotations

from asyncloader._engines.ray.group import RayWorkers

__all__ = [
    "RayWorkers",
]
