"""The real command end to end: a few steps of dew-train, its run directory, and Hydra's own tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dew.contract.journal import read_journal
from dew.recipe import Recipe
from tests.conftest import SUITE_CACHE, dew, tree
from tests.training.conftest import fast_env

pytestmark = pytest.mark.slow

TINY = [
    "experiment=digits",
    "model.config.depth=1",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "trainer.steps=4",
    "trainer.log_every=2",
    "trainer.eval_every=2",
    "trainer.checkpoint_every=2",
    "optim.schedule.warmup_steps=1",
    "flow_matching.samples_per_class=2",
    "flow_matching.sample_steps=2",
    # The suite's compilation cache (tests/conftest.py): with null, every run here compiled all its
    # programs, and the multirun's second job compiled again what its first had just compiled.
    f"trainer.compilation_cache_dir={SUITE_CACHE}",
    "trainer.checkpoint_dir=ck",
]


def test_pulse(workdir: Path):
    result = dew(*TINY, cwd=workdir, env=fast_env())
    assert result.returncode == 0, result.stderr
    run = workdir / "ck" / "digits"
    assert f"run 'digits' is in {run}" in result.stdout
    loaded = Recipe.load(str(run))
    assert loaded.trainer.steps == 4 and loaded.data.name == "digits"
    assert loaded.model.config["num_classes"] == 10 and loaded.model.config["input_size"] == 8  # from the data
    assert {"2", "4", "run.json", "samples.png", "train.log", ".hydra"} <= {p.name for p in run.iterdir()}
    assert (run / ".hydra" / "overrides.yaml").read_text().count("trainer.steps=4") == 1
    journal = read_journal(workdir / "tracking" / "digits" / "journal.jsonl")
    losses = [r["train/loss"] for r in journal if "train/loss" in r]
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)
    assert [r["event"] for r in journal if "event" in r] == ["start", "eval", "checkpoint", "eval", "checkpoint", "end"]
    assert not (workdir / "outputs").exists() and not (workdir / "multirun").exists()


def test_cfg_job_prints_the_composed_config(workdir: Path):
    result = dew("--cfg", "job", "optim.learning_rate=0.01", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "learning_rate: 0.01" in result.stdout and "architecture: simple_dit" in result.stdout
    assert tree(workdir) == []


def test_help_lists_groups_and_options(workdir: Path):
    result = dew("--help", cwd=workdir)
    assert result.returncode == 0
    for line in [
        "model: dit_b2, dit_l2, dit_s2, dit_xl2, simple_dit, transformer",
        "data: chat, digits, hf_images, hf_text, image_folder, mixture, oxford_flowers102, text_stream, token_windows",
        "optim/schedule: cosine, linear, power",
        "optim: adam, adamw, lamb, muon, muonclip",
    ]:
        assert line in result.stdout, result.stdout
    assert "schema/" not in result.stdout  # dew's plumbing is not a choice
    assert "  schedule: null" in result.stdout and "${unset:}" not in result.stdout  # as the run reads it
    assert tree(workdir) == []


def test_multirun_gives_each_job_its_own_run(workdir: Path):
    sweep = [a for a in TINY if not a.startswith("trainer.name")] + [
        "trainer.name=null",
        "trainer.steps=2",
        "trainer.eval_every=null",
        "trainer.final_samples=false",  # nothing here looks at samples (test_pulse does)
    ]
    journals = []
    for _ in range(2):  # the same command again: the same sweep, whose finished jobs are left alone
        result = dew("-m", *sweep, "optim.learning_rate=0.001,0.003", cwd=workdir, env=fast_env())
        assert result.returncode == 0, result.stderr
        journals.append(sorted(p.read_text() for p in (workdir / "tracking").rglob("journal.jsonl")))
    runs = sorted(p.parent for p in (workdir / "ck").rglob("run.json"))
    assert len(runs) == 2, runs  # one sweep of two jobs, none overwriting another
    rates = sorted(Recipe.load(str(r)).optim.learning_rate for r in runs)
    assert rates == [0.001, 0.003]
    for r in runs:
        assert (r / "2").is_dir() and json.loads((r / "run.json").read_text())["trainer"]["steps"] == 2
    assert len({r.parent for r in runs}) == 1  # one directory per sweep
    assert journals[0] == journals[1] and len(journals[0]) == 2  # nothing trained or logged again
