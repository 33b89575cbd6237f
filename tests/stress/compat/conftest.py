"""Collects the upstream suites listed in _upstream.FILES from $ASYNCLOADER_UPSTREAM.

    ASYNCLOADER_UPSTREAM=<dir>                      where the upstream files are (default:
                                                    upstream/ beside the repository)
    ASYNCLOADER_COMPAT_TARGET=asyncloader|upstream  loader under test (default asyncloader)

Their tests get node ids ``tests/stress/compat/upstream/<file>::<class>::<test>`` (select them with
``-k``: the path does not exist in this repository). Marks from expected.py are applied here.
After each test, child processes it left behind (other than multiprocessing's forkserver and
resource tracker) are reported in the terminal summary and killed, and the run fails.
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path

import pytest

from tests.helpers.processes import Exits
from tests.stress.compat import _upstream
from tests.stress.compat.expected import EXPECTED_FAILURES, FAILS_WITH_DATALOADER, PARTLY_FAILING
from tests.stress.compat.shim import TARGET

HERE = Path(__file__).parent
PREFIX = "tests/stress/compat/upstream/"

_HOW = (
    "upstream test files absent from {dir}: put PyTorch's test/test_dataloader.py and "
    "torchdata's test/stateful_dataloader/test_state_dict.py there (never in this repository), "
    "or point ASYNCLOADER_UPSTREAM at a directory that has them"
)


class UpstreamModule(pytest.Module):
    def _getobj(self):  # type: ignore[no-untyped-def]
        return _upstream.load(self.path.name)


class UpstreamSuites(pytest.Directory):
    def collect(self):  # type: ignore[no-untyped-def]
        directory = _upstream.upstream_dir()
        present = [name for name in _upstream.FILES if (directory / name).is_file()]
        if not present:
            pytest.skip(_HOW.format(dir=directory), allow_module_level=True)
        for name in present:
            yield UpstreamModule.from_parent(self, path=directory / name, nodeid=PREFIX + name)


def pytest_collect_file(file_path: Path, parent):  # type: ignore[no-untyped-def]
    # The hook runs for each file of this directory: hang the suites off this conftest.
    if file_path == Path(__file__):
        return UpstreamSuites.from_parent(
            parent, path=_upstream.upstream_dir(), nodeid=PREFIX.rstrip("/")
        )
    return None


def _key(item: pytest.Item) -> str | None:
    if not item.nodeid.startswith(PREFIX):
        return None
    return item.nodeid[len(PREFIX) :]


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    for item in items:
        key = _key(item)
        if key is None:
            continue
        if key in FAILS_WITH_DATALOADER:
            item.add_marker(
                pytest.mark.skip(reason="fails with DataLoader here: " + FAILS_WITH_DATALOADER[key])
            )
        elif TARGET == "asyncloader" and key in EXPECTED_FAILURES:
            item.add_marker(pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[key]))
        elif TARGET == "asyncloader" and key in PARTLY_FAILING:
            item.add_marker(pytest.mark.xfail(strict=False, reason=PARTLY_FAILING[key]))


# --- child processes left behind ---------------------------------------------------------

_LEAKS: list[tuple[str, list[str]]] = []


def _helper(proc) -> bool:  # type: ignore[no-untyped-def]
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        return False
    return "multiprocessing.forkserver" in cmd or "multiprocessing.resource_tracker" in cmd


def _children():  # type: ignore[no-untyped-def]
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if not _helper(p)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):  # type: ignore[no-untyped-def]
    """While an upstream test runs, ``torch.utils.data.DataLoader`` is the shim's too: some
    upstream tests spell the name that way."""
    if _key(item) is None:
        return (yield)
    with _upstream.public_name_swapped():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # type: ignore[no-untyped-def]
    if _key(item) is None or not hasattr(os, "pidfd_open"):  # exits are seen via pidfds
        return (yield)
    import psutil

    before = {p.pid for p in _children()}
    result = yield
    gc.collect()
    new = [p for p in _children() if p.pid not in before]
    exits = Exits(new)
    try:
        running = exits.wait(timeout=5.0)  # on the exits themselves, not a poll
    finally:
        exits.close()
    left = [p for p in new if p.pid in running]
    if left:
        described = []
        for p in left:
            try:
                described.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                described.append(str(p.pid))
            with contextlib.suppress(psutil.Error):
                p.kill()
        _LEAKS.append((item.nodeid, described))
        leak_log = os.environ.get("ASYNCLOADER_COMPAT_LEAK_LOG")
        if leak_log:
            with open(leak_log, "a") as f:
                f.write(f"{item.nodeid}\t{described}\n")
    return result


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    if _LEAKS:
        terminalreporter.section("child processes left behind (killed)")
        for nodeid, described in _LEAKS:
            terminalreporter.write_line(f"{nodeid}: {described}")


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    """A child process left behind fails the run (it was killed and is listed above)."""
    if _LEAKS and exitstatus == 0:
        session.exitstatus = 1
