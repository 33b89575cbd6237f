"""The report page in a real browser (headless Chromium) and from ``python -m
asyncloader.diagnose`` in a fresh interpreter (the page itself: tests/integration/tuning/)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from examples.trace_epoch import chromium, screenshot
from tests.helpers.paths import REPO
from tests.integration.tuning.test_report_page import RED, epoch


@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_headless_chromium_draws_the_page(tmp_path):
    """A real browser renders it: the screenshot holds the red of the waits and the colours
    of the timeline's stages."""
    from PIL import Image

    page = tmp_path / "report.html"
    epoch(page, traced=True)
    shot = tmp_path / "page.png"
    screenshot(page, shot)
    colours = {rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(1 << 20)}
    for hexa in (RED, "#2ca02c", "#1f77b4"):  # waits, collate, fetch
        assert tuple(int(hexa[i : i + 2], 16) for i in (1, 3, 5)) in colours, hexa


def test_diagnose_html_in_a_fresh_interpreter(tmp_path):
    root = REPO
    page = tmp_path / "fresh.html"
    subprocess.run(
        [sys.executable, "-m", "asyncloader.diagnose",
         "tests.integration.tuning.test_report_page:make_loader",
         "--batches", "4", "--html", str(page)],
        cwd=root, capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    assert "bottleneck:" in page.read_text()
