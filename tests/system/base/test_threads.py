"""The loader's own threads: torch's thread count of the trainer's thread is left alone."""

import subprocess
import sys
import textwrap

import pytest

FRESH = "import torch; print(torch.get_num_threads())"

AFTER_AN_EPOCH = textwrap.dedent(
    """
    import asyncio
    import torch
    from asyncloader import AsyncLoader

    class Source:
        def __len__(self):
            return 64

        async def __getitem__(self, index):
            await asyncio.sleep(0)
            return torch.full((32 * 1024,), index)  # 128 KiB: collated in a loader thread

    for _ in AsyncLoader(Source(), batch_size=4, transform=abs):
        pass
    print(torch.get_num_threads())
    """
)


def run(code: str) -> int:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_an_epoch_leaves_the_consumer_threads_torch_thread_count_alone():
    """Loader threads go single-threaded; the consumer thread keeps torch's default count."""
    default = run(FRESH)
    if default == 1:
        pytest.skip("torch uses one thread by default here: nothing to tell apart")
    assert run(AFTER_AN_EPOCH) == default


def test_no_finalizer_waits_while_the_loop_registry_is_locked(monkeypatch):
    """A garbage collection can start at any allocation, also at one made while a thread
    holds the lock of the loops' registry (registering a loop, parking loops for a fork).
    A loader's finalizer run there must not wait for its loop thread, which takes that lock
    as it ends: unsafe_to_wait() says so, there and nowhere else."""
    import asyncio

    from asyncloader._base import threads

    seen = []

    class Probe(dict):
        def __setitem__(self, key, value):
            seen.append(threads.unsafe_to_wait())  # where a collection could run a finalizer
            super().__setitem__(key, value)

        def pop(self, key, default=None):
            seen.append(threads.unsafe_to_wait())
            return super().pop(key, default)

    monkeypatch.setattr(threads, "_loops", Probe())
    loop = asyncio.new_event_loop()
    try:
        with threads.loop_registered(loop):
            pass
    finally:
        loop.close()
    assert seen == [True, True]
    assert not threads.unsafe_to_wait()
