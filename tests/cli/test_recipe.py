"""``dew-recipe``, the tyro command line (dew/cli/recipe.py, dew/commandline/tyro_schema.py): the same values
make the same run as ``dew-train``'s Hydra command line, a registered dataset is a subcommand, and a
bad command line ends with one line and exit status 2."""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path
from typing import ClassVar

import pytest

from dew.commandline.json_args import json_fields, quote_json_overrides, set_json_keys
from dew.commandline.tyro_schema import parse
from dew.contract.data import DataSpec, datasets
from dew.contract.journal import read_journal
from dew.data.specs import Digits, TokenWindows
from dew.recipe import Recipe
from tests.cli.test_compose import compose_recipe
from tests.conftest import REPO, SUITE_CACHE, dew
from tests.training.conftest import fast_env

TINY_MODEL = '{"depth": 1, "hidden_size": 32, "num_heads": 2, "patch_size": 2}'

# One run, said on each command line: dew-train's (Hydra overrides over conf/) and dew-recipe's (tyro
# options over the dataclasses). conf/ differs from the dataclasses in the dataset alone (digits).
# Its train step, evaluation and initialisation are those of the suite's tiny digits run
# (tests/training/conftest.py TINY: experiment=digits' weight decay, clipping and dtype, batch 32;
# the rate and the schedule are the step's arguments), which the trainer's tests put in the suite's
# compilation cache: both runs load them, where at batch 16 without them the first compiled its own.
HYDRA = [
    "model.dtype=float32",
    f"model.config={TINY_MODEL}",
    "optim/schedule=cosine",
    "optim.schedule.warmup_steps=1",
    "optim.learning_rate=0.003",
    "optim.weight_decay=0.0",
    "optim.clip_grads=1.0",
    "trainer.steps=2",
    "trainer.batch_size=32",
    "trainer.log_every=1",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    # The suite's compilation cache, the same path on both command lines (run.json records it): the
    # second run loads the programs the first compiled (with none, each compiled them all).
    f"trainer.compilation_cache_dir={SUITE_CACHE}",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
    "trainer.name=same",
]
TYRO = (
    f"data:digits --model.dtype float32 --model.config '{TINY_MODEL}' optim.schedule:cosine "
    "--optim.schedule.warmup-steps 1 --optim.learning-rate 0.003 --optim.weight-decay 0.0 --optim.clip-grads 1.0 "
    "--trainer.steps 2 --trainer.batch-size 32 "
    "--trainer.log-every 1 --trainer.eval-every None --trainer.checkpoint-every None "
    f"--trainer.compilation-cache-dir {SUITE_CACHE} --flow-matching.samples-per-class 1 --flow-matching.sample-steps 1 "
    "--trainer.name same"
)


@pytest.mark.slow
def test_dew_recipe_trains_the_run_dew_train_trains(tmp_path: Path):
    """The done-when: the same values on the two command lines train runs whose run.json files are
    the same bytes and whose journals hold the same losses, step for step."""
    hydra_dir, tyro_dir = tmp_path / "hydra", tmp_path / "tyro"
    hydra_dir.mkdir(), tyro_dir.mkdir()
    env = fast_env()
    trained = dew(*HYDRA, cwd=hydra_dir, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    recipe = dew(*shlex.split(TYRO), cwd=tyro_dir, env=env, script="dew.cli.recipe")
    assert recipe.returncode == 0, recipe.stderr[-3000:]
    run = tyro_dir / "checkpoints" / "same"
    assert f"dew-recipe: run 'same' is in {run}" in recipe.stdout
    assert (run / "run.json").read_text() == (hydra_dir / "checkpoints" / "same" / "run.json").read_text()
    assert Recipe.load(str(run)) == Recipe.load(str(hydra_dir / "checkpoints" / "same"))

    def metrics(root: Path) -> list[dict]:
        journal = read_journal(root / "tracking" / "same" / "journal.jsonl")
        # Every metric but the wall-clock ones (perf/), which no two runs share.
        return [
            {k: v for k, v in r.items() if "/" in k and not k.startswith("perf/")} | {"step": r["step"]}
            for r in journal
            if "event" not in r
        ]

    assert [m["step"] for m in metrics(tyro_dir) if "train/loss" in m] == [1, 2]
    assert metrics(tyro_dir) == metrics(hydra_dir)
    assert (run / "samples.png").is_file() and not (run / ".hydra").exists()

    # A quiet console, as dew-train's: dew's own lines, in its format, and no library chatter
    # (orbax's notes at INFO, through absl's logger, ~100 lines before) there or in train.log.
    for text in (recipe.stdout + recipe.stderr, (run / "train.log").read_text()):
        lines = text.splitlines()
        chatter = [line for line in lines if "absl" in line or "orbax" in line.lower()]
        loggers = {m.group(1) for line in lines if (m := re.match(r"\[[^]]*\]\[([^]]*)\]", line))}
        assert not chatter and loggers and all(name.split(".")[0] == "dew" for name in loggers), text[-3000:]
        assert all(line.startswith(("[", "dew-recipe: ")) for line in lines), text[-3000:]


@pytest.mark.slow
def test_help_and_a_bad_command_line_as_a_user_types_them(tmp_path: Path):
    shown = dew("--help", cwd=tmp_path, script="dew.cli.recipe")
    assert shown.returncode == 0, shown.stderr
    for name in datasets:
        assert f"data:{name.replace('_', '-')}" in shown.stdout
    for option in ("--model.config JSON", "--trainer.batch-size INT", "optim.schedule:cosine", "lora:on"):
        assert option in shown.stdout
    assert "--model.architecture {simple_dit,transformer}" in shown.stdout
    bad = dew("data:digits", "--trainer.batch-size", "0", cwd=tmp_path, script="dew.cli.recipe")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "dew-recipe: error: trainer: trainer.batch_size=0 must be positive\n"
    assert list(tmp_path.iterdir()) == []


# --- the same values, the same Recipe (in this process: no training) --------------------------------


@pytest.mark.parametrize(
    "tyro_args, hydra_overrides",
    [
        ("data:digits", []),
        (
            "data:token-windows --data.path t.bin --data.seq-len 64 --model.architecture transformer",
            ["data=token_windows", "data.path=t.bin", "data.seq_len=64"],
        ),
        (
            '--model.config \'{"depth": 2, "hidden_size": 48}\' data:digits --optim.optimizer lamb',
            ["+model.config.depth=2", "+model.config.hidden_size=48", "optim=lamb"],
        ),
        (
            "data:digits optim.schedule:power --optim.schedule.decay-fraction 0.1 --trainer.steps 1000",
            ["optim/schedule=power", "optim.schedule.decay_fraction=0.1", "trainer.steps=1000"],
        ),
        (
            "data:digits lora:on --lora.rank 4 --lora.targets qkv proj trainer.wandb:on "
            "--trainer.wandb.project demo --trainer.wandb.offline",
            ["lora={rank: 4, targets: [qkv, proj]}", "trainer.wandb={project: demo, offline: true}"],
        ),
        (
            "data:digits --trainer.layout.rules.embed fsdp tensor --trainer.eval-every epoch "
            '--optim.param-groups \'[{"pattern": "bias", "weight_decay": 0.0}]\' --flow-matching.guidance-scale 2',
            [
                "trainer.layout.rules.embed=[fsdp,tensor]",
                "trainer.eval_every=epoch",
                'optim.param_groups=[{"pattern": "bias", "weight_decay": 0.0}]',
                "flow_matching.guidance_scale=2",
            ],
        ),
        (
            "trainer.batch-ramp:on --trainer.batch-ramp.start 8 --trainer.batch-ramp.increment 8 "
            "--trainer.batch-ramp.records 256 data:digits",
            ["trainer.batch_ramp={start: 8, increment: 8, records: 256}"],
        ),
    ],
)
def test_the_same_values_make_the_same_recipe(tyro_args: str, hydra_overrides: list[str]):
    overrides = set_json_keys(quote_json_overrides(hydra_overrides, json_fields(Recipe)), json_fields(Recipe))
    assert parse(Recipe, shlex.split(tyro_args)) == compose_recipe(*overrides)  # dew-train's main rewrites them so


def test_the_defaults_are_the_dataclasses():
    assert parse(Recipe, []) == Recipe()
    assert type(parse(Recipe, []).data).__name__ == "OxfordFlowers102"  # the contract's, not conf/'s digits


def test_a_recipe_of_ones_own_parses_its_class_from_its_defaults():
    @dataclasses.dataclass(frozen=True)
    class Sweep(Recipe):
        widths: tuple[int, ...] = (32, 64)
        """The widths this recipe tries."""

    base = Sweep(data=Digits(eval_fraction=0.2), widths=(16,))
    run = parse(Sweep, ["--widths", "8", "24", "--trainer.seed", "3"], default=base)
    assert type(run) is Sweep and run.widths == (8, 24) and run.trainer.seed == 3
    assert run.data == Digits(eval_fraction=0.2)  # kept from the default: no subcommand named
    assert parse(Sweep, ["data:token-windows", "--data.path", "x"], default=base).data == TokenWindows(path="x")


def test_a_registered_dataset_is_a_subcommand(capsys):
    @datasets.register("toy_points")
    @dataclasses.dataclass(frozen=True)
    class ToyPoints(DataSpec):
        """Points on a circle."""

        kind: ClassVar[str] = "image"
        count: int = 100
        """How many points."""

    try:
        assert parse(Recipe, ["data:toy-points", "--data.count", "7"]).data == ToyPoints(count=7)
        assert parse(Recipe, ["data:toy_points"]).data == ToyPoints()  # the registry's own spelling too
        with pytest.raises(SystemExit):
            parse(Recipe, ["data:toy-points", "--help"])
        assert "Points on a circle." in capsys.readouterr().out
    finally:
        datasets._entries.pop("toy_points", None)


# --- a bad command line: one line, exit 2 -----------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        ("--trainer.stepz 3", "unrecognized --trainer.stepz 3"),
        ("--trainer.steps abc", "--trainer.steps: 'abc' is not an integer or None"),
        ("--trainer.steps", "--trainer.steps: expects 1 value"),
        ("--model.dtype f8", "--model.dtype: 'f8' is not one of float32, bfloat16, float16"),
        ("--model.architecture dit", "--model.architecture: 'dit' is not one of simple_dit, transformer"),
        ("data:nope", "unrecognized data:nope"),
        ("--trainer.steps -3", "trainer.steps=-3 must be positive"),
        ("data:digits --data.eval-fraction 2", "data.eval_fraction=2.0 must lie in (0, 1)"),
        ("--model.config {bad", "--model.config: expected JSON, found '{bad'"),
        ("--model.config '{\"depthh\": 2}'", "architecture 'simple_dit' takes no field 'depthh'"),
        ('--optim.param-groups \'[{"patern": "x"}]\'', "optim.param_groups[0].patern: unknown field of ParamGroup"),
        ("trainer.wandb:on", "missing --trainer.wandb.project"),
        ("--trainer.wandb.project p trainer.wandb:on", "missing --trainer.wandb.project"),
        ("--optim.learning-rate nan", "optim.learning_rate: expected a finite float, found float nan"),
    ],
)
def test_a_bad_command_line_ends_with_one_line(args: str, message: str, capsys):
    with pytest.raises(SystemExit) as stop:
        parse(Recipe, shlex.split(args))
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("dew-recipe: error: ") and err.count("\n") == 1, err
    assert message in err, err


def test_the_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dew-recipe"] == "dew.cli.recipe:main"
