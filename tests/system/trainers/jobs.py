"""Trainer jobs run in fresh interpreters, one process group each.

The trainers set process-wide state (seeds, signal handlers, logging, warning filters, the
accelerate state singleton) and import libraries the rest of the suite should not have loaded
(pyarrow's threads among them), so every job is a script of ``tests/system/trainers/scripts``
started
with this interpreter. A job writes what it saw as JSON; the tests compare. On the way out the
job's whole process group is killed and every process that carries the job's marker (its
workers, whoever reaps them) must have exited.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.helpers import processes
from tests.helpers.paths import REPO

ROOT = REPO
#: Nothing may be fetched from a hub; these make the Hugging Face libraries fail fast instead.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_job(command: list[str], tmp_path: Path, *, timeout: float = 90, returncode: int = 0) -> str:
    """Runs ``command`` (after this interpreter) from the repository root, offline, in a
    session of its own; returns its output once it exited with ``returncode`` and every
    process it started is gone."""
    env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HF_HOME"] = str(tmp_path / "hf_home")
    done = processes.run_job([sys.executable, *command], env, ROOT, timeout=timeout, grace=15)
    out = done.stdout
    assert done.returncode == returncode, f"exit code {done.returncode}; output:\n{out[-6000:]}"
    return out


def script_result(tmp_path: Path) -> Path:
    """A new file name under ``tmp_path`` for a job's result."""
    return tmp_path / f"result-{uuid.uuid4().hex[:8]}.json"


def run_script(
    name: str, plan: Any, tmp_path: Path, *, timeout: float = 90, returncode: int = 0
) -> Any:
    """Runs ``tests/system/trainers/scripts/NAME.py PLAN OUT`` (``plan`` as JSON); returns what the
    script wrote to ``OUT``."""
    out = script_result(tmp_path)
    script = f"tests.system.trainers.scripts.{name}"
    run_job(["-m", script, json.dumps(plan), str(out)], tmp_path, timeout=timeout,
            returncode=returncode)  # fmt: skip
    return json.loads(out.read_text()) if returncode == 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, name: str, plan: Any, tmp_path: Path, *, timeout: float = 90) -> list:
    """Runs ``tests/system/trainers/scripts/NAME.py PLAN OUT`` at ``ranks`` ranks under torchrun
    (gloo, CPU, 127.0.0.1); returns each rank's ``OUT.<rank>``, in rank order."""
    out = script_result(tmp_path)
    command = [
        "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--max_restarts=0",
        "-m", f"tests.system.trainers.scripts.{name}", json.dumps(plan), str(out),
    ]  # fmt: skip
    run_job(command, tmp_path, timeout=timeout)
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(ranks)]
