"""``dew-train --check``: every check a launch makes, for a run, a grid sweep or a study's first
trials, with the launch's own messages, and nothing trained, started or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import dew, tree
from tests.training.conftest import TINY

pytestmark = pytest.mark.slow


def errors(stderr: str) -> list[str]:
    """The ``dew-train: error:`` lines of a command's output, without the prefix."""
    return [line.split("error: ", 1)[1] for line in stderr.splitlines() if line.startswith("dew-train: error: ")]


def test_a_run_that_passes_is_one_line_and_leaves_nothing(workdir: Path):
    result = dew("--check", *TINY, "trainer.steps=4", "trainer.name=fine", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "dew-train: check: the run passes every check a launch makes; nothing was "
        f"written (its directory would be {workdir / 'checkpoints' / 'fine'})"
    )
    assert tree(workdir) == []


def test_a_bad_run_fails_the_check_as_it_fails_its_launch(workdir: Path):
    """A warmup longer than the run: the check's line is the launch's, and neither writes anything."""
    args = ["experiment=digits", "trainer.steps=20", "trainer.name=short"]
    check, launch = dew("--check", *args, cwd=workdir), dew(*args, cwd=workdir)
    assert check.returncode == launch.returncode == 2, (check.stderr, launch.stderr)
    assert (
        errors(check.stderr)
        == errors(launch.stderr)
        == [
            "optim.schedule.warmup_steps=100 exceeds the run's 20 steps; shorten it "
            "(optim.schedule.warmup_steps=2, a tenth of the run) or train at least 100 steps"
        ]
    )
    assert "Traceback" not in check.stderr and tree(workdir) == []


def test_the_check_finds_a_run_directory_that_holds_another_run(workdir: Path):
    """The run directory's record is read, as the run reads it: a different config there is refused (exit 3)."""
    assert dew(*TINY, "trainer.steps=1", "trainer.name=base", cwd=workdir).returncode == 0
    before = tree(workdir)
    check = dew("--check", *TINY, "trainer.steps=1", "trainer.name=base", "optim.learning_rate=0.1", cwd=workdir)
    assert check.returncode == 3 and "already holds a run with a different config" in check.stderr, check.stderr
    assert tree(workdir) == before


def test_a_grid_sweep_is_checked_job_by_job_with_the_launchs_messages(workdir: Path):
    args = ["-m", *TINY, "optim.schedule.warmup_steps=10", "trainer.steps=5,20", "model.dtype=float32,float33"]
    check, launch = dew("--check", *args, cwd=workdir), dew(*args, cwd=workdir)
    assert check.returncode == launch.returncode == 2, (check.stderr, launch.stderr)
    assert errors(check.stderr) == errors(launch.stderr) and len(errors(check.stderr)) == 3, check.stderr
    assert "job 0 (" in check.stderr and "exceeds the run's 5 steps" in check.stderr
    assert "job 3 (" in check.stderr and "model.dtype: expected one of" in check.stderr
    assert tree(workdir) == []
    good = dew("--check", "-m", *TINY, "trainer.steps=4,5", cwd=workdir)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip().splitlines()[-1] == (
        "dew-train: check: 2 jobs pass every check a launch makes (for a "
        "search: its first trials); nothing was started or written"
    )
    assert tree(workdir) == []


def test_a_study_checks_its_first_trials_drawn_from_its_space(workdir: Path):
    """The first batch a new study draws (the sampler's seed fixed), each checked as a run, writing
    nothing (no study.db): a space Hydra cannot merge into its field (floats for an int) is refused
    before any trial, and a drawn value dew refuses is one line per trial that draws it."""
    tiny = [a for a in TINY if not a.startswith("optim.schedule.warmup_steps=")]  # searched here
    search = [
        "-m",
        *tiny,
        "trainer.steps=40",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=8",
        "hydra.sweeper.n_jobs=3",
        "hydra.sweeper.sampler.seed=0",
    ]
    bad = dew("--check", *search, "optim.schedule.warmup_steps=interval(0, 30)", cwd=workdir)
    assert bad.returncode == 2 and len(errors(bad.stderr)) == 1, bad.stderr  # the space itself, before any trial
    assert "could not be converted to Integer" in bad.stderr and "int(interval(a, b))" in bad.stderr, bad.stderr
    assert tree(workdir) == []
    dtypes = dew("--check", *search, "model.dtype=choice(float32, float33, bfloat16)", cwd=workdir)
    assert dtypes.returncode == 2 and all("model.dtype" in e for e in errors(dtypes.stderr)), dtypes.stderr
    assert tree(workdir) == []
    good = dew("--check", *search, "optim.schedule.warmup_steps=int(interval(0, 30))", cwd=workdir)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip().splitlines()[-1].startswith("dew-train: check: 3 jobs pass")
    assert tree(workdir) == []
