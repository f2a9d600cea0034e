"""Which changed settings a resume accepts (rundir.RESUME_FREE, the knobs of objectives the run does
not train, sampling knobs) and which it refuses (anything that can change the parameters), and the
journal's record of what a resume accepted."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from dew.config import MeshSpec, TrainerConfig, Wandb
from dew.recipe import Recipe
from dew.training.run_directory import RunDirError, prepare_run_dir
from tests.training.conftest import train_tiny


def _recipe(tmp: Path, **changes) -> Recipe:
    trainer = TrainerConfig(checkpoint_dir=str(tmp), steps=10, compilation_cache_dir=None)
    base = Recipe(trainer=trainer)
    for section, values in changes.items():
        base = dataclasses.replace(base, **{section: dataclasses.replace(getattr(base, section), **values)})
    return base


ACCEPTED = [
    ({"next_token": {"top_k": 40}}, "next_token.top_k: 0 -> 40"),  # the case: a knob of another objective
    ({"flow_matching": {"guidance_scale": 3.0}}, "flow_matching.guidance_scale: 1.0 -> 3.0"),  # sampling only
    ({"trainer": {"log_every": 7}}, "trainer.log_every: 100 -> 7"),
    ({"trainer": {"wandb": Wandb("p", entity="me", offline=True)}}, "trainer.wandb: None -> "),
    ({"trainer": {"compilation_cache_dir": "/elsewhere"}}, "trainer.compilation_cache_dir: None -> '/elsewhere'"),
    ({"trainer": {"mesh": MeshSpec(data=2, fsdp=4)}}, "trainer.mesh.data: -1 -> 2"),  # the same model, laid out anew
    ({"trainer": {"max_time": "90m"}}, "trainer.max_time: None -> '90m'"),  # how long one start may run
    # The length: the set-up then checks the schedule's rates (tests/training/test_extension.py).
    ({"trainer": {"steps": 20}}, "trainer.steps: 10 -> 20"),
]
REFUSED = [
    ({"optim": {"learning_rate": 0.5}}, "optim.learning_rate: 0.00027 -> 0.5"),
    ({"flow_matching": {"label_dropout": 0.2}}, "flow_matching.label_dropout: 0.1 -> 0.2"),  # the trained objective's
    ({"flow_matching": {"ema_decay": 0.99}}, "flow_matching.ema_decay: 0.999 -> 0.99"),
    ({"trainer": {"seed": 1}}, "trainer.seed: 0 -> 1"),
]


@pytest.mark.parametrize("changes, line", ACCEPTED, ids=[a[1].split(":")[0] for a in ACCEPTED])
def test_a_resume_accepts_what_cannot_change_the_training(tmp_path, changes, line):
    prepare_run_dir(_recipe(tmp_path), "r", trains="flow_matching")
    record = (tmp_path / "r" / "run.json").read_text()
    prepare_run_dir(_recipe(tmp_path, **changes), "r", trains="flow_matching")  # no error
    assert (tmp_path / "r" / "run.json").read_text() == record  # the record keeps what built the run


@pytest.mark.parametrize("changes, line", REFUSED, ids=[r[1].split(":")[0] for r in REFUSED])
def test_a_resume_refuses_what_changes_the_parameters(tmp_path, changes, line):
    prepare_run_dir(_recipe(tmp_path), "r", trains="flow_matching")
    # Accepted changes beside a refused one are not listed as the reason.
    with pytest.raises(RunDirError, match="different config") as err:
        prepare_run_dir(_recipe(tmp_path, **changes, next_token={"top_k": 3}), "r", trains="flow_matching")
    assert line in str(err.value) and "next_token.top_k" not in str(err.value)


def test_an_unknown_objective_keeps_every_knob_blocking(tmp_path):
    prepare_run_dir(_recipe(tmp_path), "r")
    with pytest.raises(RunDirError, match="next_token.top_k: 0 -> 40"):
        prepare_run_dir(_recipe(tmp_path, next_token={"top_k": 40}), "r")
    # Naming it in the config is enough.
    prepare_run_dir(dataclasses.replace(_recipe(tmp_path), objective="flow_matching"), "q")
    prepare_run_dir(dataclasses.replace(_recipe(tmp_path, next_token={"top_k": 40}), objective="flow_matching"), "q")


@pytest.mark.slow
def test_the_resume_event_lists_what_changed(tmp_path):
    _, run, _ = train_tiny(tmp_path, "trainer.steps=4", "trainer.eval_every=null", "trainer.checkpoint_every=2")
    assert json.loads((run / "run.json").read_text())["trainer"]["log_every"] == 1
    # A completed run started again adds nothing to its journal; one whose last checkpoint is gone
    # resumes from the one before (as a run killed after step 2 would).
    shutil.rmtree(run / "4")
    _, _, journal = train_tiny(
        tmp_path,
        "trainer.steps=4",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=2",
        "trainer.log_every=5",
        "next_token.top_k=40",
    )
    resume = [r for r in journal if r.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 2
    assert resume[0]["changed"] == ["next_token.top_k: 0 -> 40", "trainer.log_every: 1 -> 5"]
    assert json.loads((run / "run.json").read_text())["trainer"]["log_every"] == 1
