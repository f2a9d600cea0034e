"""The SLURM stand-in (``slurm.py`` beside this file) as the tests use it: ``install`` writes the
commands into a directory for ``PATH``, the ``slurm_cluster`` fixture gives a test its own cluster,
``preempt`` sends SIGUSR2 to every task of a job, as SLURM does at ``--signal=USR2@...`` or on a
preemption."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

COMMANDS = ("sbatch", "srun", "scontrol", "squeue", "sacct", "scancel")
SCRIPT = Path(__file__).resolve().parent / "slurm.py"


@dataclass
class Cluster:
    """A stand-in cluster: its state directory and the environment that puts its commands first on
    ``PATH``."""

    state: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return dict(
            base,
            SLURM_STANDIN_DIR=str(self.state),
            PATH=f"{self.state / 'bin'}{os.pathsep}{base.get('PATH', os.defpath)}",
        )

    def jobs(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.state / "jobs").glob("*.json"))]

    def job(self, key: str) -> dict:
        return json.loads((self.state / "jobs" / f"{key}.json").read_text())

    def preempt(self, key: str) -> float:
        """SIGUSR2 to every task of job ``key``'s running step; the time it was sent."""
        tasks = self.job(key)["tasks"]
        assert tasks, f"job {key} runs no tasks"
        sent = time.time()
        for pid in tasks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
        return sent

    def kill_all(self) -> None:
        """SIGKILL to every job's processes still alive (a test's clean-up: JAX holds SIGTERM)."""
        for job in self.jobs():
            for pid in [*job["tasks"], job["pgid"]]:
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.killpg(job["pgid"], signal.SIGKILL)


def install(state: Path) -> Cluster:
    """The stand-in's commands in ``state/bin``, each a wrapper that runs ``slurm.py`` with this
    Python (so they work whatever ``PATH`` and ``--export`` leave to the job), isolated (``-I``:
    what the job puts on ``PYTHONPATH``, a simulated filesystem's ``sitecustomize`` included, is
    the job's, not the controller's)."""
    bin_dir = state / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (state / "jobs").mkdir(exist_ok=True)
    for name in COMMANDS:
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I "{SCRIPT}" {name} "$@"\n')
        wrapper.chmod(0o755)
    return Cluster(state)


@pytest.fixture
def slurm_cluster(tmp_path: Path):
    cluster = install(tmp_path / "slurm")
    yield cluster
    cluster.kill_all()


def task_view() -> tuple[int, int, list[int] | None]:
    """What a task of a job sees, run inside the job by submitit: (its rank, the tasks of its srun
    step, the GPUs dew gives it)."""
    from dew.launching.slurm import local_device_ids, step_tasks

    return int(os.environ["SLURM_PROCID"]), step_tasks(os.environ), local_device_ids(os.environ)
