"""A study that runs without its launcher (``hydra.sweeper.workers=N``, docs/search.md "Workers"),
on the SLURM stand-in: the command submits its workers and returns; they train the study's trials
to exactly ``n_trials``, also when one of them is SIGKILLed mid-trial; the same command run again
adds workers to the same study; arrays respect the site's ``MaxArraySize``; the settings a worker
cannot run with are refused before anything is submitted."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest

from dew.contract.rundir import STUDY_FAIL_REASON
from tests.cli.test_search import study_of
from tests.conftest import dew
from tests.slurm_standin import install
from tests.training.conftest import TINY, fast_env

SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.timeout_min=5"]
WORKERS = [
    "-m",
    "hydra/sweeper=optuna",
    "hparams_search=digits",
    "hydra.sweeper.workers=2",
    "hydra.sweeper.worker_grace_s=4",
    *TINY,
    "trainer.steps=40",
    "trainer.eval_every=40",
    "trainer.log_every=10",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
    *SLURM,
]
"""Two workers, whose trials are 40 steps of the tiny digits run: a trial trains a few seconds, so a
worker can be killed in the middle of one."""


def submit(work: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The command, forked from the suite's warm interpreter (tests/warm.py: the stand-in's variables
    are read at no import), which submits the workers as a cold start would; its time to return."""
    began = time.monotonic()
    result = dew(*WORKERS, *args, cwd=work, env=env, timeout=120)
    return result, time.monotonic() - began


def until(condition, timeout: float, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


def finished(sweep: Path) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study_of(sweep).trials if t.state.is_finished()]


@pytest.mark.slow
def test_workers_run_the_study_without_the_command_to_exactly_n_trials(tmp_path: Path):
    cluster = install(tmp_path / "slurm")
    work = tmp_path / "work"
    work.mkdir()
    env = cluster.env(fast_env(SLURM_STANDIN_MAX_ARRAY_SIZE="1"))  # no array of two: the workers in two submissions
    try:
        # 3 trials: the one the killed worker holds, and two that the other trains one after the other.
        result, took = submit(work, env, "hydra.sweeper.n_trials=3")
        assert result.returncode == 0, result.stderr[-3000:]
        assert took < 10, took
        [sweep] = list((work / "ck").glob("digits-sweep-*"))
        said = result.stdout.strip().splitlines()
        assert said[0].startswith(f"dew-train: 2 workers submitted for study {sweep.name} (0 of 3 trials finished)")
        assert said[1].strip() == f"follow it:   dew-runs ck/{sweep.name}   and   squeue --me"
        jobs = cluster.jobs()
        assert len({j["job_id"] for j in jobs}) == 2  # MaxArraySize=1 (sbatch refuses an array of two): two jobs

        # Both workers mid-trial: SIGKILL the first, its whole process group (as a node lost would).
        beats = sweep / ".workers"
        until(lambda: beats.is_dir() and len(list(beats.iterdir())) == 2, timeout=120)
        victim = cluster.jobs()[0]
        for pid in victim["tasks"]:
            os.kill(pid, signal.SIGKILL)
        until(lambda: len(finished(sweep)) == 3, timeout=240)
        until(lambda: all(j["state"] != "RUNNING" for j in cluster.jobs() if j["key"] != victim["key"]), timeout=60)
        trials = study_of(sweep).trials
        assert len(trials) == 3 and all(t.state.is_finished() for t in trials)
        failed = [t for t in trials if t.state.name == "FAIL"]
        assert len(failed) == 1, [(t.number, t.state.name) for t in trials]
        assert failed[0].user_attrs[STUDY_FAIL_REASON].startswith("its worker stopped: no heartbeat for ")
        assert sum(t.state.name == "COMPLETE" for t in trials) == 2
        assert not list(beats.iterdir())  # no heartbeat left behind

        # The same command again: more workers for the same study, to the new count, one trial more:
        # both workers ask for it, one gets it (the race for the last trial, with both alive).
        again, took = submit(work, env, "hydra.sweeper.n_trials=4")
        assert again.returncode == 0 and took < 10, again.stderr[-3000:]
        assert "(3 of 4 trials finished)" in again.stdout
        until(lambda: len(finished(sweep)) == 4, timeout=240)
        until(lambda: all(j["state"] != "RUNNING" for j in cluster.jobs() if j["key"] != victim["key"]), timeout=60)
        assert [t.number for t in study_of(sweep).trials] == list(range(4))
    finally:
        cluster.kill_all()


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["hydra.sweeper.workers=2"],
            "dew-train: error: hydra.sweeper.workers=2 needs hydra/launcher=slurm: workers are jobs that outlive "
            "this command; without it, this command runs the study (hydra.sweeper.n_jobs at a time)",
        ),
        (["hydra.sweeper.workers=0"], "dew-train: error: hydra.sweeper.workers=0 must be >= 1"),
        (
            ["hydra.sweeper.workers=2", *SLURM, "hydra.launcher.tasks_per_node=2"],
            "dew-train: error: hydra.sweeper.workers=2: a worker trains its trials in one process, and "
            "hydra.launcher asks for 2 (nodes x tasks_per_node): set both to 1",
        ),
    ],
)
@pytest.mark.slow  # a dew-train that composes and stops: ~4 s
def test_workers_the_command_cannot_run_are_refused_before_anything_is_submitted(workdir: Path, args, said):
    result = dew(
        "-m", "hydra/sweeper=optuna", "hparams_search=digits", *TINY, "trainer.checkpoint_dir=ck", *args, cwd=workdir
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(said), result.stderr
    assert not (workdir / "ck").exists() or not any((workdir / "ck").rglob("study.journal"))
