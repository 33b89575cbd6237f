"""python -m asyncloader.diagnose module:factory: runs a loader alone and prints its report."""

import asyncio
import time

import pytest

from asyncloader import AsyncLoader
from asyncloader.diagnose import load_factory, main, stalls
from tests.helpers import Waiting

pytestmark = pytest.mark.timeout(60)


def make_loader():
    return AsyncLoader(Waiting(400, 0.01), batch_size=4, io_concurrency=4)


def not_a_loader():
    return [1, 2, 3]


def test_it_runs_the_batches_asked_and_names_the_bottleneck(capsys):
    main(["tests.unit.test_diagnose:make_loader", "--batches", "12"])
    out, err = capsys.readouterr()
    assert "12 batches" in err and "waiting for data" in err
    assert "bottleneck: storage: waiting on storage" in out and "raise io_concurrency" in out


def test_a_simulated_step_makes_the_consumer_the_bottleneck(capsys):
    main(["tests.unit.test_diagnose:make_loader", "--batches", "8", "--step-ms", "60"])
    assert "bottleneck: consumer:" in capsys.readouterr().out


def test_bad_arguments_say_what_is_wrong(capsys):
    with pytest.raises(ValueError, match="module:factory"):
        load_factory("tests.unit.test_diagnose")
    with pytest.raises(SystemExit):
        main(["tests.unit.test_diagnose:not_a_loader"])
    assert "returned a list, not an AsyncLoader" in capsys.readouterr().err


#: The simulated storage's latency per sample.
STORAGE_LATENCY_S = 0.05


class Slow:
    """50 ms per sample, awaited (a simulated store, not a wait standing in for an event)."""

    def __len__(self) -> int:
        return 4000

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(STORAGE_LATENCY_S)
        return i


def burn(x: int) -> int:
    """2 ms of CPU per sample (the GIL held)."""
    began = time.perf_counter()
    while time.perf_counter() - began < 0.002:
        pass
    return x


def fetch_bound() -> AsyncLoader:
    return AsyncLoader(Slow(), batch_size=16, io_concurrency=8)


def cpu_bound() -> AsyncLoader:
    return AsyncLoader(Slow(), batch_size=16, io_concurrency=256, transform=burn)


def test_stalls_tell_a_fetch_bound_loader_from_a_cpu_bound_one(capsys):
    """DS-Analyzer's three passes: 16 samples of 50 ms at 8 at once wait on storage; the same
    read 256 at once but 2 ms of transform each wait on preprocessing."""
    fetching = stalls(fetch_bound, 12, 0.005)
    assert fetching.verdict() == "fetch-bound" and fetching.fetch_stall > 0.5
    assert fetching.in_memory < fetching.cold / 3
    burning = stalls(cpu_bound, 12, 0.005)
    assert burning.verdict().startswith("CPU-bound") and burning.prep_stall > 0.5
    main(["tests.unit.test_diagnose:fetch_bound", "--stalls", "--batches", "6"])
    assert "fetch stall" in capsys.readouterr().out
    with pytest.raises(TypeError, match="map-style"):
        stalls(lambda: AsyncLoader(iter(range(10)), batch_size=2), 2, 0.0)
