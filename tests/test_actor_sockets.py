"""How Ray actors on the training process's machine answer it: over Unix sockets
(:mod:`asyncloader._engines.ray.sockets`), tested here without Ray; tests/test_ray.py runs the
contract checkers over real actors answering this way.
"""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection

import numpy as np
import pytest

from asyncloader import AsyncLoader
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
    threads_before = threading.active_count()
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
    assert threading.active_count() == threads_before, [t.name for t in threading.enumerate()]


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
