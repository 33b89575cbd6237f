"""The package as a user gets it: the wheel built from this checkout, installed into a fresh
virtual environment with the dependencies it declares and nothing else (no dev extras), the
README's first example run there, and each extra that is missing named by its ImportError.

The fresh environment is honest rather than quick: pip installs the wheel and resolves its
own ``dependencies`` (torch, numpy, aiofiles, uvloop) from the indexes pip is configured with,
under ``constraints.txt`` (torch 2.13.0, CPU build), as ``make test`` installs the dev
environment. With ``--no-compile`` (no bytecode written at install; imports compile what they
use) that takes about 20 s on 2 cores and ~1 GB in a temporary directory, removed afterwards;
compiling all of torch's modules at install would take as long again, and so would deleting
the files it writes. The build runs on a copy of the files a build reads (pyproject.toml,
README.md, LICENSE, asyncloader/), so the checkout gets no ``build/`` directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

ROOT = REPO

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.platform == "win32", reason="the venv layout below is POSIX's"),
]

#: What a build reads: pyproject.toml's ``readme`` and ``license-files``, and the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE")

#: Each extra, a call that needs it, and what its ImportError must say.
EXTRAS = {
    "remote-http": (
        "from asyncloader.sources import HTTPSource\nHTTPSource(['http://127.0.0.1:9/x'])",
        "asyncloader[remote]",
    ),
    "remote-s3": (
        "from asyncloader.sources import ObjectStoreSource\n"
        "ObjectStoreSource('s3://bucket/train/')",
        "asyncloader[remote]",
    ),
    "images": (
        "from asyncloader.images import ImageBatch\nImageBatch(8)([b'not an image'])",
        "asyncloader[images]",
    ),
    "ray": (
        "from asyncloader.ray import RayEngine\nRayEngine(num_workers=1)",
        "asyncloader[ray]",
    ),
}

#: Run in the fresh environment: each extra's call, and what it raised (or None).
PROBE = """
import json, sys, traceback
calls = json.loads(sys.argv[1])
raised = {}
for name, code in calls.items():
    try:
        exec(code, {})
        raised[name] = None
    except BaseException as exc:
        raised[name] = [type(exc).__name__, str(exc), traceback.format_exc()]
print(json.dumps(raised))
"""

#: Modules of an extra that must be absent from the fresh environment for the checks to mean
#: anything (fsspec is not among them: torch itself depends on it).
EXTRA_MODULES = ("aiohttp", "s3fs", "PIL", "ray", "pytest")


class Env:
    """The fresh environment: its interpreter, a clean working directory, the built wheel."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.python = root / "venv" / "bin" / "python"
        self.cwd = root / "run"  # no asyncloader/ and no stray packages beside the scripts
        self.wheel = wheel

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        # -I: no PYTHONPATH, no user site, no script directory or cwd on sys.path.
        return run([str(self.python), "-I", *args], cwd=self.cwd, timeout=timeout)


def run(cmd: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def checked(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "asyncloader", src / "asyncloader", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    checked(
        run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
            cwd=tmp,
            timeout=300,
        )
    )
    (wheel,) = dist.glob("asyncloader-*.whl")
    return wheel


@pytest.fixture(scope="module")
def fresh() -> Iterator[Env]:
    with tempfile.TemporaryDirectory(prefix="asyncloader-packaging-") as name:
        tmp = Path(name)
        wheel = build_wheel(tmp)
        env = Env(tmp, wheel)
        env.cwd.mkdir()
        checked(run([sys.executable, "-m", "venv", str(tmp / "venv")], cwd=tmp, timeout=120))
        install = [str(env.python), "-m", "pip", "--disable-pip-version-check", "install"]
        install += ["--quiet", "--no-compile", "-c", str(ROOT / "constraints.txt"), str(wheel)]
        checked(run(install, cwd=tmp, timeout=540))
        yield env


def readme_example() -> str:
    """The README's first Python block."""
    match = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_wheel_holds_every_module_the_license_and_the_typed_marker(fresh: Env) -> None:
    with zipfile.ZipFile(fresh.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    package = ROOT / "asyncloader"
    modules = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py")}
    assert modules - names == set(), "modules the wheel leaves out"
    assert "asyncloader/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: BSD-3-Clause" in metadata.decode()


def test_fresh_environment_has_no_extras(fresh: Env) -> None:
    code = (
        "import importlib.util, json, sys, asyncloader\n"
        f"print(json.dumps([asyncloader.__file__, sys.prefix, "
        f"[m for m in {EXTRA_MODULES!r} if importlib.util.find_spec(m)]]))"
    )
    where, prefix, present = json.loads(checked(fresh.run("-c", code)).stdout)
    assert Path(where).is_relative_to(prefix), "asyncloader imported from outside the venv"
    assert present == [], "the fresh environment has modules of extras"


def test_readme_first_example_runs_from_the_wheel(fresh: Env) -> None:
    script = fresh.cwd / "readme_example.py"
    script.write_text(readme_example())
    proc = checked(fresh.run(str(script)))
    assert proc.stdout.strip(), "the example printed nothing"


@pytest.fixture(scope="module")
def raised(fresh: Env) -> dict[str, list[str] | None]:
    calls = {name: code for name, (code, _) in EXTRAS.items()}
    proc = checked(fresh.run("-c", PROBE, json.dumps(calls)))
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_missing_extra_is_named(raised: dict[str, list[str] | None], extra: str) -> None:
    what = raised[extra]
    assert what is not None, f"{extra}: the call needs the extra but raised nothing"
    kind, message, trace = what
    wanted = EXTRAS[extra][1]
    assert kind in ("ImportError", "ModuleNotFoundError"), trace
    assert wanted in message, f"{extra}: the ImportError does not name {wanted!r}:\n{trace}"
