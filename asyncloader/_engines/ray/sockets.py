"""Ray actors on the training process's machine, answering over Unix sockets.

An actor on the training process's own node needs neither Ray calls nor the object store to
return a batch. The training process listens on a Unix socket in a private temporary folder
(mode 0700, so only this user's processes can connect); each actor connects
(:func:`connect_actor`) and answers on a thread of its own with the local workers' loop
(:func:`asyncloader._worker.loop.serve_on`). From then on requests and answers travel as they
do to a local ``fetch_in_workers`` worker (:class:`~asyncloader._engines.channels.Channels`): a
batch is pickled once into the socket and once out of it, with no object-store put, no get,
and no copy to make it writable. The socket's file and folder are removed once every actor
has connected.

An actor is dead once its connection closed: a process's sockets close when it dies,
however it dies. Ray then says why (:class:`ActorSockets` asks it).

The handshake does not rely on the folder's mode alone (defence in depth): on Linux each side
compares the uid of the process at the other end (``SO_PEERCRED``,
:func:`asyncloader._base.compat.peer_uid`) with its own effective uid before it reads or sends
anything, and closes a connection of another user's (elsewhere that check is skipped). A
second hello for a worker id already connected is closed and logged; it never replaces the
first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from asyncloader._base import peer_uid
from asyncloader._engines import Channels
from asyncloader._worker import serve_on

log = logging.getLogger("asyncloader")

#: Seconds to wait for an actor that said it connected to be accepted and send its hello.
ACCEPT_TIMEOUT_S = 30.0


def _stranger(sock: socket.socket) -> int | None:
    """The uid of the peer of ``sock`` when it is not this process's own (None: ours, or a
    platform without ``SO_PEERCRED``, where nothing is checked)."""
    uid = peer_uid(sock)
    return None if uid is None or uid == os.geteuid() else uid


@contextlib.contextmanager
def listening(num_workers: int) -> Iterator[tuple[socket.socket, str]]:
    """A Unix socket listening in a new private folder: ``(server, path)``; both are removed
    on exit, by when every actor must have connected."""
    folder = tempfile.mkdtemp(prefix="asyncloader-")  # mode 0700
    path = os.path.join(folder, "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(num_workers)
        yield server, path
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def accept(server: socket.socket, count: int) -> dict[int, tuple[socket.socket, Connection]]:
    """Accepts ``count`` actors that connected: worker id -> (socket, connection), each past
    its hello (its worker id, then :func:`serve_on`'s ``ready``). A connection from another
    uid is closed before anything of it is read, and one whose worker id is connected
    already is closed after its id: both are logged and not counted.

    Raises:
        TimeoutError: ``count`` actors did not connect and say hello within
            :data:`ACCEPT_TIMEOUT_S`.
    """
    deadline = time.monotonic() + ACCEPT_TIMEOUT_S

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    accepted: dict[int, tuple[socket.socket, Connection]] = {}
    try:
        while len(accepted) < count:
            server.settimeout(max(1e-3, left()))  # 0 would make it non-blocking
            sock, _ = server.accept()
            sock.setblocking(True)
            if (uid := _stranger(sock)) is not None:
                log.warning("refused a connection of uid %d (not ours) to the actors' socket", uid)
                sock.close()
                continue
            conn = Connection(os.dup(sock.fileno()))
            worker = conn.recv() if conn.poll(left()) else None
            if isinstance(worker, int) and worker in accepted:
                log.warning("refused a second connection for worker %d: already connected", worker)
                sock.close()
                conn.close()
                continue
            if not isinstance(worker, int) or not conn.poll(left()):
                sock.close()
                conn.close()
                raise TimeoutError("an actor connected but did not say hello")
            conn.recv()  # ("ready", ...): start() has each actor's init failure already
            accepted[worker] = (sock, conn)
    except BaseException:
        for sock, conn in accepted.values():
            sock.close()
            conn.close()
        raise
    return accepted


def connect_actor(path: str, plan: Any, config: Any, worker_id: int) -> bool:
    """In an actor: connects to the training process's socket at ``path`` and serves it on a
    thread of its own; ``False`` when it cannot be reached from here."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return False
    if (uid := _stranger(sock)) is not None:
        log.warning("not serving %s: its listener runs as uid %d, not ours", path, uid)
        sock.close()
        return False
    conn = Connection(sock.detach())
    conn.send(worker_id)

    def serve() -> None:
        try:
            serve_on(conn, plan, config, worker_id, role="Ray actor")
        finally:  # the training process sees the end, also of a loop that failed
            conn.close()

    threading.Thread(target=serve, name="asyncloader-serve", daemon=True).start()
    return True


class ActorSockets(Channels):
    """The connections to a :class:`~asyncloader.ray.RayEngine`'s actors, all on this machine.

    Args:
        accepted: Worker id -> (socket, connection), from :func:`accept`.
        loader_name: Names the loader in crash reports.
        why_dead: Says why actor ``i`` died (blocking; asks Ray), once its connection closed.
    """

    def __init__(
        self,
        accepted: dict[int, tuple[socket.socket, Connection]],
        loader_name: str,
        why_dead: Callable[[int], str],
    ) -> None:
        super().__init__(len(accepted), loader_name)
        self._sockets = [accepted[i][0] for i in range(self.num_workers)]
        self._conns = [accepted[i][1] for i in range(self.num_workers)]
        self._why_dead = why_dead
        self._listen()

    def _how_died(self, i: int) -> Any:
        return self._why_dead(i)

    def _death_note(self, i: int, how: Any, held: str) -> str:
        return f"Ray actor {i} died while running {held}: {how}"

    def stop(self) -> None:
        """Cancels what is pending and asks each actor to stop serving."""
        self._stop_requests()

    def close(self) -> None:
        """Closes the sockets and joins the receiver (after :meth:`stop`). Idempotent."""
        self._stop_requests()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the receiver reads the end of each
        self._join_receiver()
        for sock, conn in zip(self._sockets, self._conns, strict=True):
            sock.close()
            conn.close()
