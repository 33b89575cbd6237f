"""How Ray actors on the training process's machine answer it: over Unix sockets
(:mod:`asyncloader._engines.ray.sockets`), tested here without Ray;
tests/stress/engines/ray/test_ray.py runs the
contract checkers over real actors answering this way.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection

import numpy as np
import pytest

from asyncloader import AsyncLoader
from asyncloader._base import compat
from asyncloader._engines.fetching_workers import worker_specs
from asyncloader._engines.ray import sockets as _actor_sockets
from asyncloader._engines.ray.sockets import ActorSockets, accept, connect_actor, listening
from asyncloader._worker.plan import BatchPlan
from asyncloader._worker.protocol import Ready, RunBatch
from tests.helpers import SyncSource


def test_listening_makes_a_private_folder_and_removes_it():
    with listening(2) as (_, path):
        folder = os.path.dirname(path)
        assert os.stat(folder).st_mode & 0o777 == 0o700, "other users could connect"
    assert not os.path.exists(folder)


def test_accept_gives_up_on_an_actor_that_connects_but_never_says_hello(monkeypatch):
    monkeypatch.setattr(_actor_sockets, "ACCEPT_TIMEOUT_S", 0.2)
    with listening(1) as (server, path), socket.socket(socket.AF_UNIX) as mute:
        mute.connect(path)
        with pytest.raises(TimeoutError, match="did not say hello"):
            accept(server, 1)


def serve_in_this_process(path: str, worker_id: int) -> None:
    """What an actor does on connect: serve the socket on a thread (here, of this process).

    Batches of numpy arrays: this process is no worker, so a tensor would leave it through
    torch's shared memory, whose fd passing starts a thread here for good."""
    options = AsyncLoader(
        SyncSource(16), num_workers=1, fetch_in_workers=True, collate_fn=np.stack
    )._options
    spec = worker_specs(options, BatchPlan.of(options), 0, 1)[0]
    assert connect_actor(path, spec.plan, spec.config, worker_id)


def serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "asyncloader-serve"]


def test_an_actor_answers_its_batches_over_its_socket_and_stops_when_closed():
    threads_before = set(threading.enumerate())  # other tests' threads may end meanwhile
    with listening(1) as (server, path):
        serve_in_this_process(path, 0)
        group = ActorSockets(accept(server, 1), "AsyncLoader", lambda i: "unused")
    try:
        futures = [group.submit(seq, [2 * seq, 2 * seq + 1], None, None) for seq in range(4)]
        got = [f.result(timeout=30) for f in futures]
        assert [batch[:, 0].tolist() for batch in got] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    finally:
        group.stop()
        group.close()
    for thread in serving_threads():
        thread.join(timeout=30)
    assert not serving_threads(), "the actor's serving thread outlived close()"
    assert not group._receiver.is_alive()
    # The core stops its compute thread without waiting for user code: it ends once idle.
    for thread in threading.enumerate():
        if thread.name.startswith("asyncloader-compute"):
            thread.join(timeout=30)
    started = [t.name for t in threading.enumerate() if t not in threads_before]
    assert not started, f"threads this test started outlived close(): {started}"


def test_an_actor_whose_socket_closes_fails_what_it_held_and_is_named():
    """A process's sockets close however it dies: that is the actor's death, and Ray's word
    on it names the cause."""
    with listening(1) as (server, path):
        dying = socket.socket(socket.AF_UNIX)
        dying.connect(path)
        actor = Connection(dying.detach())
        actor.send(0)
        actor.send(Ready(None))
        group = ActorSockets(accept(server, 1), "AsyncLoader", lambda i: f"actor {i}: killed")
    try:
        held = group.submit(5, [10, 11], None, None)
        assert isinstance(actor.recv().request, RunBatch)  # it took the request, then died
        actor.close()
        with pytest.raises(BrokenProcessPool):
            held.result(timeout=30)
        assert group.broken
        note = group.describe_crash({5: [10, 11]})
        assert note == "Ray actor 0 died while running batch 5 (indices [10, 11]): actor 0: killed"
        with pytest.raises(BrokenProcessPool):
            group.submit(6, [12], None, None)
    finally:
        group.close()


# The handshake checks who connected (SO_PEERCRED) and refuses a worker id
# that is connected already.

LINUX = sys.platform.startswith("linux")
UNPICKLED: list[str] = []


def _unpickled() -> int:
    UNPICKLED.append("a stranger's hello was unpickled")
    return 0


class Trap:
    """A hello whose unpickling records itself: what a refused peer sent is never read."""

    def __reduce__(self):
        return (_unpickled, ())


def framed(*messages) -> bytes:
    """The bytes a Connection sends for ``messages``."""
    a, b = socket.socketpair()
    with a, b:
        conn = Connection(a.detach())
        for message in messages:
            conn.send(message)
        conn.close()
        out = b""
        while chunk := b.recv(1 << 16):
            out += chunk
    return out


def raw_actor(path: str, worker: int) -> Connection:
    """An actor's side of the handshake, by hand: connect, worker id, Ready."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    conn = Connection(sock.detach())
    conn.send(worker)
    conn.send(Ready(None))
    return conn


def closed_by_peer(sock: socket.socket) -> bool:
    """The other end closed ``sock`` (a reset, when it closed with our bytes unread)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def closing(accepted):
    for sock, conn in accepted.values():
        sock.close()
        conn.close()


@pytest.mark.skipif(not LINUX, reason="SO_PEERCRED is Linux's")
def test_peer_uid_is_the_connected_process_uid():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert compat.peer_uid(a) == os.geteuid()


def test_a_second_hello_for_a_connected_worker_is_refused_and_the_first_kept(caplog):
    with listening(2) as (server, path):
        first, second, third = raw_actor(path, 0), raw_actor(path, 0), raw_actor(path, 1)
        accepted = accept(server, 2)
    try:
        assert sorted(accepted) == [0, 1]
        accepted[0][1].send("ping")
        assert first.poll(5), "the first connection of worker 0 was replaced"
        assert first.recv() == "ping"
        assert second.poll(5), "the second connection of worker 0 was not closed"
        with pytest.raises((EOFError, ConnectionResetError)):
            second.recv()
        assert any("worker 0" in r.message and "already" in r.message for r in caplog.records)
    finally:
        closing(accepted)
        for conn in (first, second, third):
            conn.close()


@pytest.mark.skipif(not LINUX, reason="SO_PEERCRED is Linux's")
def test_a_peer_of_another_uid_is_refused_before_its_hello_is_read(monkeypatch, caplog):
    """As the kernel reports it: the first peer seems another user's. Its connection is closed
    unread, and accept() goes on to the genuine actor."""
    real = compat.peer_uid
    seen = []

    def peer_uid(sock):
        seen.append(sock)
        return os.geteuid() + 1 if len(seen) == 1 else real(sock)

    monkeypatch.setattr(_actor_sockets, "peer_uid", peer_uid)
    UNPICKLED.clear()
    stranger = socket.socket(socket.AF_UNIX)
    with listening(1) as (server, path):
        stranger.connect(path)
        stranger.sendall(framed(Trap(), Ready(None)))
        genuine = raw_actor(path, 1)
        accepted = accept(server, 1)
    try:
        assert list(accepted) == [1] and UNPICKLED == []
        assert closed_by_peer(stranger), "the stranger's connection stayed open"
        assert any("uid" in r.message for r in caplog.records)
    finally:
        closing(accepted)
        genuine.close()
        stranger.close()


@pytest.mark.skipif(not LINUX or os.geteuid() != 0, reason="needs root (to become nobody)")
def test_a_process_of_another_user_is_refused_for_real():
    """A child that became ``nobody`` connects (the folder opened up for it: the 0700 mode
    is the first defence, this is the second) and is refused, unread."""
    UNPICKLED.clear()
    hello = framed(Trap(), Ready(None))
    with listening(1) as (server, path):
        os.chmod(os.path.dirname(path), 0o711)
        os.chmod(path, 0o777)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no pytest, no exception escapes
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                sock = socket.socket(socket.AF_UNIX)
                sock.connect(path)
                sock.sendall(hello)
                os.write(ready_w, b"c")
                code = 0 if closed_by_peer(sock) else 2
            finally:
                os._exit(code)
        accepted = {}
        try:
            os.close(ready_w)
            assert os.read(ready_r, 1) == b"c", "the child could not connect"
            genuine = raw_actor(path, 1)
            accepted = accept(server, 1)
            assert list(accepted) == [1] and UNPICKLED == []
        finally:
            closing(accepted)
            os.close(ready_r)
            _, status = os.waitpid(pid, 0)
    genuine.close()
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not LINUX, reason="SO_PEERCRED is Linux's")
def test_an_actor_does_not_serve_a_socket_of_another_uid(monkeypatch):
    monkeypatch.setattr(_actor_sockets, "peer_uid", lambda sock: os.geteuid() + 1)
    with listening(1) as (server, path):
        assert connect_actor(path, None, None, 0) is False
        server.settimeout(5)
        sock, _ = server.accept()
        with sock:
            assert closed_by_peer(sock), "the actor said hello to a stranger"
