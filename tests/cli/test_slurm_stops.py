"""A SLURM job stopped without a requeue (``scancel``: SIGTERM to every task) ends the launching
``dew-train -m`` with one line, where its checkpoint is and how to resume, through the stand-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dew.contract.journal import read_journal
from tests.cli.test_slurm import RUN, SLURM, setup_lines
from tests.slurm_standin import slurm_cluster  # noqa: F401 - the fixture
from tests.training.conftest import fast_env
from tests.training.test_multiprocess import events, logged, until, wait

pytestmark = pytest.mark.slow


def test_a_cancelled_job_ends_the_command_with_one_line(workdir: Path, slurm_cluster):
    env = slurm_cluster.env(fast_env(SLURM_STANDIN_KILL_WAIT="120"))
    one_node = [a for a in SLURM if not a.startswith("hydra.launcher.nodes=")] + ["hydra.launcher.nodes=1"]
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dew.cli.train",
            "-m",
            *one_node,
            setup_lines(env),
            *RUN,
            "trainer.name=sc",
            "trainer.steps=100000",
        ],
        cwd=workdir,
        env=env,
        stdout=open(workdir / "sweep.out", "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    journal = lambda: next((workdir / "tracking").glob("sc-sweep-*/*/journal.jsonl"), None)  # noqa: E731
    try:
        until(lambda: (journal() is not None and logged(journal(), 2)) or sweep.poll() is not None, timeout=400)
        (job,) = slurm_cluster.jobs()
        subprocess.run([slurm_cluster.state / "bin" / "scancel", job["key"]], env=env, check=True, timeout=60)
        (code,) = wait([sweep], timeout=300)
    finally:
        wait([sweep], timeout=1)
    out = (workdir / "sweep.out").read_text()
    assert code == 143 and "Traceback" not in out and "UncompletedJobError" not in out, out[-3000:]
    stopped = [s for kind, s in events(read_journal(journal())) if kind == "stop"]
    (run,) = (p.parent for p in (workdir / "ck").rglob("run.json"))
    last = out.strip().splitlines()[-1]
    assert len(stopped) == 1 and (run / str(stopped[0])).is_dir()
    assert last.startswith("dew-train: job 0 (") and f"stopped at step {stopped[0]}, checkpoint " in last, last
    assert f"{run.relative_to(workdir)}/{stopped[0]}; resume with: dew-train -m hydra/launcher=slurm" in last
