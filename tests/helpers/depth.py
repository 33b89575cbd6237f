"""How deep the randomised tests go: ``ASYNCLOADER_TEST_DEPTH=quick`` (``make check``) runs a
quarter of their seeds and examples, the default (``make test``, CI) all of them. The same
tests run either way; only how many schedules each tries changes."""

from __future__ import annotations

import os

QUICK = os.environ.get("ASYNCLOADER_TEST_DEPTH", "full") == "quick"


def scaled(n: int) -> int:
    """``n`` seeds or examples at full depth; a quarter (at least one) at quick depth."""
    return max(1, n // 4) if QUICK else n
