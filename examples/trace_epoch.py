"""Trace a fetch-bound and a CPU-bound epoch, and write each one's report page.

::

    python examples/trace_epoch.py [--out traces] [--samples 1536] [--screenshot]

Two loaders over the same samples (an async dataset: 5 to 20 ms per sample, as a remote
store answers), with a 10 ms training step:

- ``fetch-bound``: at most 8 samples in flight (``io_concurrency=8``);
- ``cpu-bound``: 256 in flight, and 3 ms of ``transform`` per sample in 2 workers.

For each, ``<out>/<name>.json`` is the trace (open it in https://ui.perfetto.dev) and
``<out>/<name>.html`` the page; ``--screenshot`` also renders the page to
``<out>/<name>.png`` with headless Chromium (Debian's ``chromium``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import torch

import asyncloader
from asyncloader import AsyncLoader

BATCH, STEP_S = 32, 0.010


class Remote:
    """An async map-style dataset of ``n`` samples: sample ``i`` after 5 to 20 ms."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> torch.Tensor:
        await asyncio.sleep(0.005 + 0.015 * ((i * 7919) % 100) / 100)
        return torch.full((4096,), float(i))


def decode(sample: torch.Tensor) -> torch.Tensor:
    """3 ms of CPU per sample, as an image decode and augment would take."""
    began = time.perf_counter()
    while time.perf_counter() - began < 0.003:
        pass
    return sample


def loaders(n: int) -> dict[str, AsyncLoader]:
    return {
        "fetch-bound": AsyncLoader(Remote(n), batch_size=BATCH, io_concurrency=8, num_workers=2),
        "cpu-bound": AsyncLoader(
            Remote(n), batch_size=BATCH, io_concurrency=256, num_workers=2, transform=decode
        ),
    }


def chromium() -> str | None:
    """Debian's Chromium, where installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: Path, png: Path) -> None:
    """``page`` rendered to ``png`` by headless Chromium (1040 pixels wide)."""
    chromium_path = chromium()
    if chromium_path is None:
        raise SystemExit("--screenshot needs chromium (apt-get install chromium)")
    subprocess.run(
        [chromium_path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={png.parent / '.chromium'}",
         "--window-size=1040,1300", f"--screenshot={png}", page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("traces"))
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--screenshot", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, loader in loaders(args.samples).items():
        with asyncloader.trace(args.out / f"{name}.json"), loader:
            for _ in loader:
                time.sleep(STEP_S)  # the training step
            print(f"{name}: {loader.report(html=args.out / f'{name}.html').splitlines()[1]}")
        if args.screenshot:
            screenshot(args.out / f"{name}.html", args.out / f"{name}.png")


if __name__ == "__main__":
    main()
