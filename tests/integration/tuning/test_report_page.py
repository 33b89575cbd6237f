"""loader.report(html=path) and ``diagnose --html``: one self-contained page, read back as a
parser and a real browser (headless Chromium) see it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import asyncloader
from asyncloader import AsyncLoader
from asyncloader.diagnose import main

pytestmark = pytest.mark.timeout(120)
RED = "#d62728"


class Waiting:
    def __len__(self) -> int:
        return 96

    async def __getitem__(self, i: int) -> torch.Tensor:
        await asyncio.sleep(0.002)
        return torch.full((20_000,), i)


class Parts(HTMLParser):
    """Every tag, and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.loads: list[str] = []
        self.titles = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.loads += [f"{k}={v}" for k, v in attrs if k in ("src", "href")]
        self.titles += tag == "title"


def parsed(path: Path) -> tuple[Parts, str]:
    text = path.read_text()
    parts = Parts()
    parts.feed(text)
    return parts, text


def epoch(path: Path, traced: bool) -> AsyncLoader:
    loader = AsyncLoader(Waiting(), batch_size=8, num_workers=2)
    with asyncloader.trace(path.with_suffix(".json")) if traced else contextlib.nullcontext():
        for _ in loader:
            time.sleep(0.002)  # the consumer's step
        loader.report(html=path)
    return loader


def test_the_page_is_one_file_with_the_verdict_the_waits_and_the_stages(tmp_path):
    page = tmp_path / "report.html"
    loader = epoch(page, traced=True)
    parts, text = parsed(page)
    assert "script" not in parts.tags and parts.loads == []  # opens offline, loads nothing
    assert f"bottleneck: {loader.bottleneck().stage}" in text
    assert "svg" in parts.tags and "Stage utilisation" in text
    # one red bar per batch after the first (the consumer's waits), each with its numbers
    assert text.count("<title>step ") == loader.stats.batches - 1
    assert "training process: MainThread" in text and "worker 0: MainThread" in text
    assert "wait for batch 11: " in text  # a slice of the timeline, named


def test_without_a_trace_the_page_says_how_to_get_a_timeline(tmp_path):
    page = tmp_path / "plain.html"
    epoch(page, traced=False)
    _, text = parsed(page)
    assert "with asyncloader.trace(path):" in text and "Stage utilisation" in text
    fresh = AsyncLoader(Waiting(), batch_size=8)
    fresh.report(html=tmp_path / "before.html")  # before any epoch: a page all the same
    assert "bottleneck: unknown" in (tmp_path / "before.html").read_text()


def make_loader() -> AsyncLoader:
    return AsyncLoader(Waiting(), batch_size=8)


def test_diagnose_writes_the_page_and_its_trace(tmp_path, capsys):
    page = tmp_path / "diag.html"
    main(
        [
            "tests.integration.tuning.test_report_page:make_loader",
            "--batches",
            "6",
            "--html",
            str(page),
        ]
    )
    assert f"wrote {page}" in capsys.readouterr().out
    _, text = parsed(page)
    assert "training process: MainThread" in text
    assert Path(f"{page}.trace.json").stat().st_size > 0
