"""Sweeps: a sweep over a named experiment with W&B (offline) runs every job and publishes each
one's artifact, never writes into the run the name already holds, and names each job directory by
its swept values; JSON values on the command line work as the docs write them."""

from __future__ import annotations

import json
import os
import re

import pytest

from dew.launching.naming import SWEEP_ENV, job_dirname, sweep_name
from dew.training.reporting.trackers.wandb import artifact_name
from tests.training.conftest import TINY, dew_train

SHORT = ["trainer.steps=2", "trainer.eval_every=null", "trainer.checkpoint_every=null", "trainer.checkpoint_dir=ck"]


def test_artifact_names_are_valid_recognisable_and_distinct():
    valid = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
    assert artifact_name("digits") == "digits"
    names = ["digits-sweep-1/0-optim.learning_rate=0.001,trainer.seed=1", "a/b", "a b", "a-b", "x" * 300]
    published = [artifact_name(n) for n in names]
    assert all(valid.match(p) for p in published), published
    assert published[0].startswith("digits-sweep-1-0-optim.learning_rate-0.001-trainer.seed-1-")
    assert len(set(published)) == len(published)


def test_job_names_show_the_swept_values(monkeypatch, tmp_path):
    fixed = [
        "experiment=digits",
        "model.config.depth=1",
        "model.config.hidden_size=32",
        "trainer.steps=2",
        "flow_matching.samples_per_class=1",
        "flow_matching.sample_steps=1",
        "trainer.compilation_cache_dir=null",
    ]
    monkeypatch.setenv(SWEEP_ENV, json.dumps({"dir": "s", "swept": ["optim.learning_rate", "trainer.seed"]}))
    a = job_dirname(0, [*fixed, "optim.learning_rate=0.001", "trainer.seed=1"])
    b = job_dirname(1, [*fixed, "optim.learning_rate=0.003", "trainer.seed=1"])
    assert (a, b) == ("0-learning_rate=0.001,seed=1", "1-learning_rate=0.003,seed=1")
    # A sampler's float at 4 significant digits, a key by as many parts as tell it from another.
    monkeypatch.setenv(SWEEP_ENV, json.dumps({"dir": "s", "swept": ["optim.learning_rate", "x.depth", "y.depth"]}))
    drawn = ["optim.learning_rate=0.0012345678901234", "x.depth=3", "y.depth=123456"]
    assert job_dirname(7, drawn) == "7-learning_rate=0.001235,x.depth=3,y.depth=123456"
    # A sweep an older dew named by whole keys and values goes on in its jobs' directories.
    old = tmp_path / "7-optim.learning_rate=0.0012345678901234,x.depth=3,y.depth=123456"
    old.mkdir()
    assert job_dirname(7, drawn, str(tmp_path)) == old.name
    assert job_dirname(8, drawn, str(tmp_path)) == "8-learning_rate=0.001235,x.depth=3,y.depth=123456"
    # Without the sweep's record: every override but the fixed keys, long ones cut with a hash.
    monkeypatch.delenv(SWEEP_ENV)
    long_a = job_dirname(0, [*fixed, "optim.learning_rate=0.001", f"trainer.wandb.project={'p' * 100}"])
    assert long_a.startswith("0-sample_steps=1,samples_per_class=1,depth=1,") and "experiment" not in long_a
    long_b = job_dirname(0, [*fixed, "optim.learning_rate=0.003", f"trainer.wandb.project={'p' * 100}"])
    assert len(long_a) <= 2 + 120 and long_a != long_b


def test_a_sweep_named_inside_a_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(SWEEP_ENV, raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text("{}")
    try:
        with pytest.raises(ValueError, match="would lie inside the run"):
            sweep_name("a/b", str(tmp_path), ["optim.learning_rate=1e-3,3e-3"])
        assert sweep_name("a", str(tmp_path), ["optim.learning_rate=1e-3,3e-3"]).startswith("a-sweep-")
        assert json.loads(os.environ[SWEEP_ENV])["swept"] == ["optim.learning_rate"]
    finally:
        os.environ.pop(SWEEP_ENV, None)


@pytest.mark.slow
def test_a_wandb_sweep_beside_the_named_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # The named run, with the model, the param groups and the optimizer options as JSON strings.
    tiny = [a for a in TINY if not a.startswith("model.config.")]
    single = dew_train(
        *tiny,
        *SHORT,
        'model.config={"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 2}',
        'optim.param_groups=[{"pattern": "bias", "weight_decay": 0.0}]',
        'optim.optimizer_opts={"b1": 0.8}',
        cwd=work,
    )
    assert single is not None and single.returncode == 0, single.stdout[-3000:]
    record = json.loads((work / "ck" / "digits" / "run.json").read_text())
    assert record["model"]["config"]["depth"] == 1 and record["model"]["config"]["hidden_size"] == 32
    assert record["optim"]["param_groups"] == [{"pattern": "bias", "lr_multiplier": 1.0, "weight_decay": 0.0}]
    assert record["optim"]["optimizer_opts"] == {"b1": 0.8}
    before = sorted((p.relative_to(work), p.stat().st_mtime_ns) for p in (work / "ck" / "digits").rglob("*"))

    # Job 1 loads the initialisation and train programs job 0 compiled (the suite's cache).
    sweep = dew_train(
        "-m",
        *TINY,
        *SHORT,
        "optim.learning_rate=1e-3,3e-3",
        "trainer.wandb={project: p, offline: true}",
        cwd=work,
    )
    assert sweep is not None and sweep.returncode == 0, sweep.stdout[-3000:]
    assert sorted((p.relative_to(work), p.stat().st_mtime_ns) for p in (work / "ck" / "digits").rglob("*")) == before
    [folder] = list((work / "ck").glob("digits-sweep-*"))
    jobs = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert jobs == ["0-learning_rate=0.001", "1-learning_rate=0.003"]
    from dew.runs.status import read_run  # the grid ends naming its best run, as dew-runs ranks them

    # Runs that never evaluate (trainer.eval_every=null: not even their last step) by their last train/loss.
    summaries = [read_run(folder / job, job).summary for job in jobs]
    assert all(r.best is None for r in summaries), summaries
    best = min(summaries, key=lambda r: r.train_loss)
    ended = sweep.stdout.strip().splitlines()[-1]
    assert ended == (
        f"dew-train: best of 2 runs by train/loss: {best.path} (train/loss {best.train_loss:.4g}); "
        f"dew-runs {folder.relative_to(work)} lists them all"
    ), ended
    for job in jobs:
        assert (folder / job / "run.json").is_file()
        overrides = (folder / job / ".hydra" / "overrides.yaml").read_text()
        assert "experiment=digits" in overrides and "model.config.depth=1" in overrides
        [wandb_record] = list((work / "tracking" / folder.name / job / "wandb").rglob("run-*.wandb"))
        assert artifact_name(f"{folder.name}/{job}").encode() in wandb_record.read_bytes()
