"""A bad value on the command line, of any kind, ends in exactly one line on stderr naming the field,
the value and what is allowed, exit status 2, and nothing written: a single run, ``--check`` and a
sweep (``-m``) of ``dew-train``, and ``dew-recipe``. Each case is a real command in an empty
directory (forked from the suite's warm interpreter: tests/warm.py)."""

from __future__ import annotations

import pytest

from tests.conftest import dew, tree

pytestmark = pytest.mark.slow

DIGITS = ["experiment=digits", "trainer.checkpoint_dir=ck"]

CASES = [
    # (command line, its one line after "dew-train: error: ")
    # a value of the wrong type
    ([*DIGITS, "trainer.batch_size=abc"], "trainer.batch_size='abc': not an integer"),
    ([*DIGITS, "trainer.batch_size=12.5"], "trainer.batch_size=12.5: not an integer"),
    ([*DIGITS, "trainer.steps=1.5e3"], "trainer.steps=1.5e3: not an integer; write trainer.steps=1500"),
    (["--check", *DIGITS, "optim.learning_rate=fast"], "optim.learning_rate='fast': not a number"),
    ([*DIGITS, "trainer.batch_size=null"], "trainer.batch_size=null: cannot be null"),
    (
        [*DIGITS, "trainer.mesh=4"],
        "trainer.mesh=4: trainer.mesh is a record (MeshSpec), not a value; set its fields one by one "
        "(trainer.mesh.data=...; its fields are data, fsdp, tensor)",
    ),
    # an option a config group does not have (nested groups too)
    ([*DIGITS, "optim=sgd"], "optim=sgd: no such option in group optim; the options are adam, adamw, lamb, muon"),
    (
        ["--check", *DIGITS, "optim/schedule=step"],
        "optim/schedule=step: no such option in group optim/schedule; the options are cosine, linear, power",
    ),
    (
        [*DIGITS, "trainer/trackers=[csv,tensorbord]"],
        "trainer/trackers=tensorbord: no such option in group trainer/trackers; the options are csv, mlflow, "
        "tensorboard, wandb",
    ),
    (
        ["experiment=digitz"],
        "experiment=digitz: no such option in group experiment; the options are digits, tiny_lm, tiny_mdlm",
    ),
    # a field the config does not have
    ([*DIGITS, "trainer.stpes=10"], "trainer.stpes: unknown field of trainer (TrainerConfig); its fields are name, "),
    (
        [*DIGITS, "optim.schedule.warmup=5"],
        "optim.schedule.warmup: unknown field of optim.schedule (CosineSchedule); its fields are warmup_steps, "
        "floor_ratio",
    ),
    (
        ["--check", *DIGITS, "data.shuffle=false"],
        "data.shuffle: unknown field of data (Digits); its fields are eval_fraction",
    ),
    ([*DIGITS, "steps=10"], "steps: neither a config group nor a field of the run; the groups are data, debug, "),
    # a value out of the range the config allows
    ([*DIGITS, "trainer.steps=-5"], "trainer: trainer.steps=-5 must be positive"),
    ([*DIGITS, "optim.schedule.floor_ratio=2"], "optim.schedule: optim.schedule.floor_ratio=2.0 must lie in [0, 1]"),
    (
        [*DIGITS, "trainer.steps=50"],
        "optim.schedule.warmup_steps=100 exceeds the run's 50 steps; shorten it (optim.schedule.warmup_steps=5, "
        "a tenth of the run) or train at least 100 steps",
    ),
    # a malformed mapping
    ([*DIGITS, 'model.config={"depth": }'], "model.config: cannot parse the value '{\"depth\": }'"),
    ([*DIGITS, "trainer.mesh={data: x}"], "trainer.mesh.data='x': not an integer"),
    (
        [*DIGITS, "model.config={mlp_ratio: 2}"],
        "model.config.mlp_ratio: not a key of model.config as composed (its keys are patch_size, hidden_size, "
        "depth, num_heads); add one with ++model.config={mlp_ratio: ...} or +model.config.mlp_ratio=...",
    ),
    ([*DIGITS, "model.config=[1,2]"], "model.config: expected dict[str, typing.Any], found list [1, 2]"),
    # a sweep: every job composed before the first starts, and the sweep's directory not left behind
    (["-m", *DIGITS, "trainer.steps=2", "trainer.batch_size=8,abc"], "trainer.batch_size='abc': not an integer"),
    (
        ["--check", "-m", *DIGITS, "optim=adam,sgd"],
        "optim=sgd: no such option in group optim; the options are adam, adamw, lamb, muon, muonclip",
    ),
    # a flag after the overrides
    (
        [*DIGITS, "-m", "trainer.steps=2,3"],
        "trainer.steps=2,3: an override after a flag; the flags (-m, --cfg, --check, ...) go before the overrides",
    ),
]


@pytest.mark.parametrize("args, line", CASES, ids=[" ".join(a for a in c[0] if a not in DIGITS) for c in CASES])
def test_a_bad_value_is_one_line_exit_2_and_nothing_written(tmp_path, args, line):
    result = dew(*args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)
    [only] = result.stderr.splitlines()  # exactly one line
    assert only.startswith(f"dew-train: error: {line}"), only
    assert tree(tmp_path) == [], "a bad value left files behind"


RECIPE_CASES = [
    ("--trainer.batch-size abc", "--trainer.batch-size: 'abc' is not an integer"),
    ("--trainer.steps 1.5e3", "--trainer.steps: '1.5e3' is not an integer or None"),
    ("--optim.optimizer sgd", "--optim.optimizer: 'sgd' is not one of adam, adamw, lamb, muon, muonclip"),
    ("--trainer.stpes 10", "unrecognized --trainer.stpes 10"),
    ("--trainer.steps -5", "trainer: trainer.steps=-5 must be positive"),
    ("--model.config {depth:", "--model.config: expected JSON, found '{depth:'"),
]


@pytest.mark.parametrize("args, line", RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_a_bad_value_through_dew_recipe_is_one_line_exit_2(tmp_path, args, line):
    result = dew("data:digits", *args.split(), "--trainer.checkpoint-dir", "ck", cwd=tmp_path, script="dew.cli.recipe")
    assert result.returncode == 2, (result.returncode, result.stderr)
    [only] = result.stderr.splitlines()
    assert only.startswith(f"dew-recipe: error: {line}"), only
    assert tree(tmp_path) == []
