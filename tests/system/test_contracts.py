"""The contracts of tests/helpers/contract_matrix.py over the object store (SeaweedFS's S3
gateway, started once per session on 127.0.0.1), in every placement."""

from __future__ import annotations

import pytest

from tests.helpers.contract_matrix import (  # noqa: F401  (the fixtures the kind uses)
    KINDS,
    PLACEMENTS,
    contract_s3,
    parametrize_matrix,
    sources,
    test_bounded_window,
    test_clean_shutdown,
    test_draws_in_workers_repeat,
    test_exactly_once,
    test_order,
    test_resume_at_every_position,
    test_resume_with_workers,
)

STORE_KINDS = [kind for kind in KINDS if kind.name == "object-store"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_matrix(metafunc, STORE_KINDS, PLACEMENTS)
