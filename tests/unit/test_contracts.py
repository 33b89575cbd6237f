"""The contracts of tests/helpers/contract_matrix.py over every kind of source that needs no
external store, with the work in this process (the caller's loop and the loader's threads)."""

from __future__ import annotations

import pytest

from tests.helpers.contract_matrix import (  # noqa: F401  (the fixtures the kinds use)
    IN_PROCESS,
    KINDS,
    contract_files,
    contract_http,
    parametrize_matrix,
    sources,
    test_bounded_window,
    test_clean_shutdown,
    test_exactly_once,
    test_order,
    test_resume_at_every_position,
)

LOCAL_KINDS = [kind for kind in KINDS if kind.name != "object-store"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_matrix(metafunc, LOCAL_KINDS, [IN_PROCESS])
