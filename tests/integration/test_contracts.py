"""The contracts of tests/helpers/contract_matrix.py over every kind of source that needs no
external store, with the work in 2 worker processes: transforming only, and fetching too.
At quick depth (make check) each kind runs in one of the two, alternating."""

from __future__ import annotations

import pytest

from tests.helpers.contract_matrix import (  # noqa: F401  (the fixtures the kinds use)
    KINDS,
    WITH_WORKERS,
    contract_files,
    contract_http,
    parametrize_matrix,
    sources,
    test_bounded_window,
    test_clean_shutdown,
    test_draws_in_workers_repeat,
    test_exactly_once,
    test_order,
    test_resume_with_workers,
)
from tests.helpers.depth import QUICK

LOCAL_KINDS = [kind for kind in KINDS if kind.name != "object-store"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not QUICK or "placement" not in metafunc.fixturenames:
        parametrize_matrix(metafunc, LOCAL_KINDS, WITH_WORKERS)
        return
    pairs = [(kind, WITH_WORKERS[i % len(WITH_WORKERS)]) for i, kind in enumerate(LOCAL_KINDS)]
    metafunc.parametrize(
        ("kind", "placement"),
        [
            pytest.param(kind, where.values[0], id=f"{kind.name}-{where.id}")
            for kind, where in pairs
        ],
    )
