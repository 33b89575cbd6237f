"""Per-loop clients: one per running loop, closed at that loop's shutdown; sources pickle."""

import asyncio
import pickle
import threading

from asyncloader import AsyncLoader
from asyncloader.sources import ObjectStoreSource, ShardedSource
from asyncloader.sources._perloop import PerLoop
from tests.helpers import shard_set


class Clients:
    """Makes numbered clients and records which were closed, and on which loop."""

    def __init__(self):
        self.made, self.closed = [], []

    async def make(self):
        await asyncio.sleep(0)  # a real client's setup awaits: tasks may race here
        self.made.append((len(self.made), asyncio.get_running_loop()))
        return self.made[-1]

    async def close(self, client):
        assert client[1] is asyncio.get_running_loop(), "closed on the loop that made it"
        self.closed.append(client[0])


def test_one_client_per_loop_even_when_tasks_race():
    """Concurrent first uses on one loop share one client; the loser's extra one is closed."""
    clients = Clients()
    per = PerLoop(clients.make, clients.close)

    async def run():
        got = await asyncio.gather(*(per.get() for _ in range(10)))
        assert len({id(c) for c in got}) == 1 and len(per) == 1

    asyncio.run(run())
    assert len(per) == 0, "closed when asyncio.run shut the loop down"
    assert sorted(clients.closed) == list(range(len(clients.made)))


def test_each_loop_gets_its_own_client_and_aclose_closes_it():
    """Loops in two threads get two clients; aclose closes only the running loop's."""
    clients = Clients()
    per = PerLoop(clients.make, clients.close)
    seen = []

    def in_thread():
        async def run():
            seen.append(await per.get())
            await per.aclose()
            await per.aclose()  # idempotent
            assert len(per) == 0

        asyncio.run(run())

    threads = [threading.Thread(target=in_thread) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2 and seen[0][1] is not seen[1][1]
    assert len(clients.closed) == 2


def test_sources_pickle_without_clients_and_work_after(tmp_path):
    """A used source pickles (clients dropped) and the copy reads the same samples."""
    shards = shard_set(2, 3)
    for name, data in shards.items():
        (tmp_path / name).write_bytes(data)
    source = ShardedSource([str(tmp_path / n) for n in shards], shuffle=False, shard_concurrency=1)
    first = [s["__key__"] for s in AsyncLoader(source, batch_size=None)]
    clone = pickle.loads(pickle.dumps(source))
    assert [s["__key__"] for s in AsyncLoader(clone, batch_size=None)] == first
    store = ObjectStoreSource(["s3://bucket/a", "s3://bucket/b"], storage_options={"anon": True})
    assert pickle.loads(pickle.dumps(store)).targets == ["s3://bucket/a", "s3://bucket/b"]
