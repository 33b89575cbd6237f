"""Upstream tests that do not pass here, and why. Keys: ``<upstream file>::<class>::<test>``.

EXPECTED_FAILURES: pass with DataLoader / StatefulDataLoader, fail with AsyncLoader; marked
``xfail(strict=True)`` when ASYNCLOADER_COMPAT_TARGET=asyncloader, so a fix shows up as an
XPASS, which fails the run until its entry is removed. docs/compatibility.md repeats
these reasons.

PARTLY_FAILING: ``xfail(strict=False)``, for tests made of subtests of which only some fail
with AsyncLoader (each passing subtest of a strict xfail would be an XPASS), and for tests
whose failure depends on thread timing (they pass on some runs: strict, they would make the
suite flaky). The reason says which.

FAILS_WITH_DATALOADER: fail on the baseline too (in this environment); skipped on both targets.
"""

_DL = "test_dataloader.py::"
_SD = "test_state_dict.py::"

#: The reasons, each a documented difference (docs/compatibility.md).
PRIVATE = "reads DataLoader's private attributes ({})"
PREFETCHED_GETITEM = (
    "num_workers=0: __getitem__ runs ahead of the consumer in a loader thread, so its draws "
    "from torch's global RNG are not where a checkpoint is taken (use workers or seed_per_sample)"
)
DATAPIPES = "IterDataPipe shuffle settings (DataPipes are deprecated in torch) are not applied"

EXPECTED_FAILURES: dict[str, str] = {
    **{
        f"{_DL}{cls}::test_multiprocessing_iterdatapipe": DATAPIPES
        for cls in ("TestDataLoader", "TestDataLoaderPersistentWorkers")
    },
    f"{_DL}IntegrationTestDataLoaderDataPipe::test_shuffler_iterdatapipe": (
        f"{DATAPIPES}; {PRIVATE.format('_iterator')}"
    ),
    f"{_DL}TestIndividualWorkerQueue::test_ind_worker_queue": (
        "batch i goes to whichever worker is free, not to worker i % num_workers (deliberate: "
        "a slow batch never holds up the batches queued behind it on its worker)"
    ),
    f"{_SD}TestNumWorkersMismatch_shard3::test_num_workers_mismatch": (
        "num_workers may change between save and resume (deliberate; StatefulDataLoader "
        "raises AssertionError)"
    ),
    f"{_SD}TestInitialState_shard0::test_init_error": (
        "a worker_init_fn error is raised by the first next(), not by iter(): workers start "
        "in the background (DataLoader also raises it at the first batch)"
    ),
}

TIMING = " (whether it fails depends on thread timing: it passes on some runs)"

PARTLY_FAILING: dict[str, str] = {
    f"{_SD}TestStatefulSampler_shard1::test_random_state": (
        f"its num_workers=0 subtests: {PREFETCHED_GETITEM} (the num_workers=3 ones pass)"
    ),
    f"{_SD}TestSnapshotZero_shard2::test_map_iterrupted_shuffle": PREFETCHED_GETITEM + TIMING,
}

FAILS_WITH_DATALOADER: dict[str, str] = {
    f"{_DL}{cls}::test_get_worker_info": (
        "its spawned child exits with 1 under this harness (the module is loaded from a path), "
        "with DataLoader too"
    )
    for cls in ("TestDataLoader", "TestDataLoaderPersistentWorkers")
}
