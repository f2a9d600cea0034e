"""Runs that stop on their own terms end with one sentence and their own exit status, no traceback:
a divergence names the last good checkpoint (and the journal records the stop), and checkpoints that
no longer restore are named by step, by dew-train and by dew-sample, with nothing moved or deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dew.commandline.exits import EXIT_NO_INTACT_CHECKPOINT, EXIT_NONFINITE
from dew.contract.journal import read_journal
from tests.cli.test_pulse import TINY
from tests.conftest import dew, tree
from tests.training.conftest import fast_env

DIVERGING = [*TINY, "trainer.steps=20", "trainer.log_every=1", "trainer.eval_every=null", "optim.learning_rate=1e6"]


@pytest.mark.slow
def test_divergence_then_damaged_checkpoints(workdir: Path):
    result = dew(*DIVERGING, cwd=workdir, env=fast_env())
    assert result.returncode == EXIT_NONFINITE, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    run = workdir / "ck" / "digits"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dew-train: error: the loss or the gradients became non-finite at step "), last
    assert f"The last good checkpoint, left intact: step 2 in {run / '2'}" in last
    records = read_journal(workdir / "tracking" / "digits" / "journal.jsonl")
    assert records[-1]["event"] == "stop" and records[-1]["reason"] == "nonfinite"
    assert records[-1]["message"] in last and "end" not in [r.get("event") for r in records]

    # Its only checkpoint loses its record: dew-sample names the step, moves nothing...
    os.remove(run / "2" / "meta" / "metadata")
    before = tree(workdir)
    sample = dew(str(run), "--step", "2", cwd=workdir, script="dew.cli.sample")
    assert sample.returncode == 2 and "Traceback" not in sample.stderr, sample.stderr
    assert (
        f"dew-sample: error: --step 2: checkpoint step 2 in {run / '2'} is damaged: FileNotFoundError" in sample.stderr
    )
    sample = dew(str(run), cwd=workdir, script="dew.cli.sample")
    assert sample.returncode == 2 and f"no checkpoint in {str(run)!r} can be read: step 2: " in sample.stderr
    assert tree(workdir) == before
    # ... and dew-train refuses to resume it, naming it, with nothing moved or deleted.
    again = dew(*DIVERGING, cwd=workdir, env=fast_env())
    assert again.returncode == EXIT_NO_INTACT_CHECKPOINT, again.stderr
    assert "Traceback" not in again.stderr
    assert f"dew-train: error: no checkpoint in {run} restores; nothing was moved or deleted. step 2: " in again.stderr
    assert (run / "2" / "state").is_dir() and not [p for p in run.iterdir() if "damaged" in p.name]
