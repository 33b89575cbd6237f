"""Where things are in the repository, wherever the test that asks lives."""

from pathlib import Path

#: The repository's root (the folder with pyproject.toml), the working directory of scripts.
REPO = Path(__file__).resolve().parents[2]
#: The system tier's scripts: torchrun jobs, hygiene scripts, the scale epochs.
SYSTEM = REPO / "tests" / "system"
