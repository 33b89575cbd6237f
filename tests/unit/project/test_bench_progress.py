"""The benchmark driver's progress: each run measures how long its consumer waited for batches
(benchmarks/run_one.py), and the bar over the runs shows the last run's samples/s and that
stall fraction on stderr, leaving stdout to the results (benchmarks/bench.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench, run_one
from benchmarks.checks import Checker, make_sample
from benchmarks.plan import Case

SHAPE = (16,)


class Clock:
    """A simulated ``perf_counter``: it moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowLoader:
    """Yields 4 batches of 2 samples; each batch takes ``wait`` simulated seconds to come."""

    def __init__(self, clock: Clock, wait: float) -> None:
        self.clock, self.wait = clock, wait

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __iter__(self):
        for k in range(0, 8, 2):
            self.clock.now += self.wait
            yield np.stack([make_sample(i, SHAPE) for i in (k, k + 1)])


class SlowChecker(Checker):
    """A consumer whose step takes ``step`` simulated seconds per batch."""

    def __init__(self, clock: Clock, step: float) -> None:
        super().__init__(8, SHAPE)
        self.clock, self.step = clock, step

    def add(self, batch) -> int:
        self.clock.now += self.step
        return super().add(batch)


@pytest.mark.parametrize(("wait", "step", "stall"), [(3.0, 1.0, 0.75), (1.0, 3.0, 0.25)])
def test_a_run_reports_the_share_of_time_its_consumer_waited(monkeypatch, wait, step, stall):
    """stall_fraction: time in next() over the consumer's time, after the first batch."""
    clock = Clock()
    monkeypatch.setattr(run_one, "clock", clock)
    result = run_one.measure(SlowLoader(clock, wait), SlowChecker(clock, step))
    assert result["stall_fraction"] == pytest.approx(stall)


def test_the_bar_shows_samples_per_second_and_stall_on_stderr_only(monkeypatch, capsys, tmp_path):
    """Each run's samples/s and stall reach the bar, on stderr; stdout stays for results."""
    cases = [Case("asyncloader", "io", 64, 100, rep) for rep in range(2)]
    figures = iter([(1234.0, 0.5), (2345.0, 0.97)])

    def fake_run(case, port):
        rate, stall = next(figures)
        return {"items_per_s": rate, "stall_fraction": stall, "rep": case.rep}

    monkeypatch.setattr(bench, "run_case", fake_run)
    results = bench.run_all(cases, None, tmp_path)
    out, err = capsys.readouterr()
    assert [r["rep"] for r in results] == [0, 1]
    assert out == ""
    assert "1,234 samples/s" in err and "stall 50%" in err
    assert "2,345 samples/s" in err and "stall 97%" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [c.file_stem() + ".json" for c in cases]
