"""``dew-eval RUN --follow --launch slurm``: the follower submitted as a job of its own under the
SLURM launch profile (through submitit and dew's batch script, on the suite's SLURM stand-in) follows
a tiny run to its end, each saved step evaluated once with the values the run's own evaluation
recorded; a second follower of the same run is refused with one line, in the job and before a
submission."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dew.contract.lock import RunLock
from tests.cli.test_slurm import setup_lines
from tests.conftest import dew
from tests.slurm_standin import slurm_cluster  # noqa: F401 - the fixture
from tests.training.conftest import fast_env, losses, train_tiny

PROFILE = [
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=10",
    "+hydra.launcher.additional_parameters.export=NONE",
]


@pytest.mark.slow  # dew-eval's imports (JAX): 3.4 s
def test_a_second_follower_is_refused_and_the_profile_makes_the_batch_script(tmp_path):
    from dew.inference import following
    from dew.inference.composing import EvalError

    run = tmp_path / "ck" / "lm"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")  # the follower locks once the run's record exists
    first = RunLock(run / "eval").acquire()  # as a follower holds it
    try:
        args = argparse.Namespace(run=str(run), overrides=[], tasks_only=False, poll=0.01)
        with pytest.raises(EvalError, match=r"^--follow: .*/ck/lm is already followed by process \d+ on "):
            following.follow(args, sleep=lambda s: None)
        # The command, as a user runs it (its own process): refused before anything is submitted.
        refused = dew_eval(str(run), "--follow", "--launch", "slurm", "hydra.launcher.partition=gpu", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("dew-eval: error: --follow: ") and "one follower a run" in line
        assert not (run / "eval" / "follow-jobs").exists()
    finally:
        first.release()
    two = dew_eval(str(run), "--follow", "--launch", "slurm", "hydra.launcher.nodes=2", cwd=tmp_path)
    assert two.returncode == 2 and "hydra.launcher.nodes=2: a follower is one process" in two.stderr, two.stderr
    # The profile's settings in the batch script (a dry run prints it): one task, --requeue, the partition.
    dry = ["--follow", "--launch", "slurm", "hydra.launcher.partition=gpu", "hydra.launcher.dry_run=true"]
    printed = dew_eval(str(run), *dry, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    for line in ("--partition=gpu", "--ntasks-per-node=1", "--nodes=1", "--requeue", "--job-name=lm-follow"):
        assert f"#SBATCH {line}\n" in script, line
    assert f"--output={run / 'eval' / 'follow-jobs'}/%j/%j_0_log.out" in script
    assert not (run / "eval" / "follow-jobs").exists()
    # Requeued (SIGUSR2), the job runs the same follower again: it resumes from its record.
    job = following.FollowJob(args)
    again = job.checkpoint()
    assert isinstance(again.function, following.FollowJob) and again.function.args == job.args


def dew_eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``dew-eval ARGS`` in its own process, as a user runs it. (In this process, the launch path's
    printing to a test's captured stdout after an in-process training run once closed pytest's own
    capture of stderr, and every later test of the worker failed: run as the command it is.)"""
    return dew(*args, cwd=cwd, script="dew.cli.eval")


@pytest.mark.slow
def test_the_follower_as_a_slurm_job_follows_a_run_to_its_end(tmp_path, slurm_cluster):
    _, run, journal = train_tiny(
        tmp_path,
        "trainer.steps=4",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=2",
        "trainer.keep=5",
    )
    env = slurm_cluster.env(fast_env())
    submitted = subprocess.run(
        [sys.executable, "-m", "dew.cli.eval", str(run), "--follow", "--launch", "slurm", "--poll", "0.2"]
        + [*PROFILE, setup_lines(env)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr
    (job,) = slurm_cluster.jobs()
    assert submitted.stdout.startswith(f"dew-eval: following {run} as slurm job {job['job_id']} (log: ")
    script = Path(slurm_cluster.state / "scripts" / f"{job['key']}.sh").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --ntasks-per-node=1" in script  # the profile's, one task
    assert "#SBATCH --job-name=run-follow" in script
    deadline = time.monotonic() + 300
    while slurm_cluster.job(job["key"])["state"] in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, "the follower did not end"
        time.sleep(0.5)
    log = "".join(p.read_text() for p in (run / "eval" / "follow-jobs").rglob("*_log.out"))
    assert slurm_cluster.job(job["key"])["state"] == "COMPLETED", log
    (record_file,) = (run / "eval").glob("follow-*.json")
    record = json.loads(record_file.read_text())
    assert sorted(record["steps"], key=int) == ["2", "4"], record
    recorded = losses(journal, "eval/loss")
    for step, note in record["steps"].items():
        assert note["metrics"]["eval/loss"] == pytest.approx(recorded[int(step)], rel=1e-4), step
    assert f"dew-eval: {run} ended; 2 steps evaluated" in log
