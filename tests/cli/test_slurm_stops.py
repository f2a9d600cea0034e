"""A SLURM job stopped without a requeue (``scancel``: SIGTERM to every task) ends the launching
``dew-train -m`` with one line, where its checkpoint is and how to resume, through the stand-in."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from dew.contract.journal import read_journal
from tests.cli.test_slurm import RUN, SLURM, setup_lines
from tests.slurm_standin import slurm_cluster  # noqa: F401 - the fixture
from tests.training.conftest import dew_train, fast_env
from tests.training.test_multiprocess import events, logged, until

pytestmark = pytest.mark.slow


def test_a_cancelled_job_ends_the_command_with_one_line(workdir: Path, slurm_cluster):
    env = slurm_cluster.env(fast_env(SLURM_STANDIN_KILL_WAIT="120"))
    one_node = [a for a in SLURM if not a.startswith("hydra.launcher.nodes=")] + ["hydra.launcher.nodes=1"]
    # The launching command forked from the suite's warm interpreter (tests/warm.py: it skips the
    # imports of a cold start), in a thread, while this one cancels its job; its output in dew-train.out.
    ended: list[subprocess.CompletedProcess] = []
    args = [*one_node, setup_lines(env), *RUN, "trainer.name=sc", "trainer.steps=100000"]
    sweep = threading.Thread(
        target=lambda: ended.append(dew_train("-m", *args, cwd=workdir, env=env, timeout=700)), daemon=True
    )
    sweep.start()
    journal = lambda: next((workdir / "tracking").glob("sc-sweep-*/*/journal.jsonl"), None)  # noqa: E731
    # (Every 0.1 s: the job trains as fast as it can, and may be cancelled at any step after the second.)
    until(lambda: (journal() is not None and logged(journal(), 2)) or not sweep.is_alive(), 400, 0.1)
    (job,) = slurm_cluster.jobs()
    subprocess.run([slurm_cluster.state / "bin" / "scancel", job["key"]], env=env, check=True, timeout=60)
    sweep.join(300)
    assert ended, "the launching command did not end within 300 s of the scancel (or raised: see above)"
    code = ended[0].returncode
    out = (workdir / "dew-train.out").read_text()
    assert code == 143 and "Traceback" not in out and "UncompletedJobError" not in out, out[-3000:]
    stopped = [s for kind, s in events(read_journal(journal())) if kind == "stop"]
    (run,) = (p.parent for p in (workdir / "ck").rglob("run.json"))
    last = out.strip().splitlines()[-1]
    assert len(stopped) == 1 and (run / str(stopped[0])).is_dir()
    assert last.startswith("dew-train: job 0 (") and f"stopped at step {stopped[0]}, checkpoint " in last, last
    assert f"{run.relative_to(workdir)}/{stopped[0]}; resume with: dew-train -m hydra/launcher=slurm" in last
