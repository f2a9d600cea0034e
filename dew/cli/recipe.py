"""``dew-recipe``: the run from a tyro command line, trained as ``dew-train`` trains it.

The API contract's door: "Recipes parse it with tyro, build the objective and the data it names, and
hand both to RunConfig.train". ``parse`` (``dew.commandline.tyro_schema``) reads a ``Recipe`` with tyro and
converts it with the reader ``dew-train`` converts Hydra's config with, and ``train_recipe`` builds and
trains it through ``dew-train``'s own set-up, so the same values make the same ``run.json``, the same
run directory and the same exit statuses (``dew.cli.train``'s ``EXIT_*``). What it has of Hydra's is
nothing: no config groups, no sweeps (``dew-train -m``), no ``.hydra/`` in the run directory.

A recipe of one's own calls the two functions with its own class and defaults::

    run = parse(MyRecipe, default=MyRecipe(data=Digits(), ...), prog="my-recipe")
    train_recipe(run, prog="my-recipe")

Its defaults are the dataclasses' (``RunConfig``'s: the contract's), not conf/'s: ``dew-train``'s
command line starts from conf/config.yaml (``data=digits``; ``data=token_windows`` picks the
transformer), ``dew-recipe``'s from ``Recipe()`` (``oxford_flowers102``; the model is named).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from typing import TYPE_CHECKING

from dew.build import build_run
from dew.cli.train import agree, check_single_run, fail, refusal, train_set_up
from dew.commandline.console import console_script
from dew.commandline.exits import debugging
from dew.commandline.tyro_schema import parse
from dew.contract.config import RunConfig
from dew.launching.checks import CHECK_FLAG
from dew.launching.pool import from_process_zero
from dew.recipe import Recipe
from dew.training.run_directory import refuse_if_held, run_dir

if TYPE_CHECKING:
    from dew.training.setup import Planned
    from dew.training.step import TrainState

PROG = "dew-recipe"

DESCRIPTION = f"""Train a run described on the command line (tyro), as dew-train trains it: the same
values make the same run.json. A dataset is a subcommand, data:NAME, one per registered dataset; so is the
learning-rate schedule (optim.schedule:NAME) and each optional record (lora:on, trainer.wandb:on, ...).
A subcommand's options follow it; the others may come anywhere. --model.config and --optim.optimizer-opts
take one JSON object.
Defaults are the dataclasses' (dew.config), not dew-train's conf/. {CHECK_FLAG}: every check a launch makes,
nothing trained or written."""


_STAMP = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_name(run: RunConfig) -> str:
    """The run's directory under ``trainer.checkpoint_dir``: ``trainer.name``, else the start time."""
    return run.trainer.name or f"run-{_STAMP}"


def train_recipe(run: RunConfig, *, prog: str = PROG) -> TrainState:
    """Build ``run`` and train it as ``dew-train`` does (the same set-up, metrics, summary, samples
    and record); a run refused before it trains, or one that stops on its own terms, ends with one
    line and ``dew-train``'s exit status for it."""
    from dew.training.setup import set_up  # heavy: JAX loads once the config is valid

    held = contextlib.ExitStack()  # the lock and the signal handlers, to the end of the run
    try:
        planned, setup = set_up(run.trainer, held, lambda: plan(run), agree=agree)
    except Exception as err:
        refused = refusal(err)
        if refused is None:
            raise  # a bug: its traceback is the report
        held.close()
        fail(*refused, prog=prog)
    return train_set_up(planned, setup, held, prog=prog)


def plan(run: RunConfig) -> Planned:
    """What the run trains, once the process pool is up: process 0's record and name (a time-stamped
    name can differ by a second between processes), the data loaded and the objective built."""
    from dew.training.setup import Planned  # heavy: JAX loads once the config is valid

    record, name = from_process_zero("run", [run.to_dict(), run_name(run)])
    if record != run.to_dict():
        run = type(run).from_dict(record)
    refuse_if_held(run_dir(run, name))
    return Planned(*build_run(run), name)


def check_recipe(run: RunConfig, *, prog: str = PROG) -> None:
    """``--check``: every check a launch makes (``dew-train --check``'s), nothing written."""
    try:
        check_single_run(run, os.fspath(run_dir(run, run_name(run))), prog=prog)
    except Exception as err:
        refused = refusal(err)
        if refused is None:
            raise
        fail(*refused, prog=prog)


def console_logging() -> None:
    """The console's log as ``dew-train``'s: Hydra configures it there from
    conf/hydra/job_logging/dew.yaml (the format; absl's and JAX's loggers at WARNING, so orbax's
    notes at INFO stay off the console and out of train.log), and nothing would here."""
    import logging.config
    from pathlib import Path

    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir

    settings = OmegaConf.to_container(OmegaConf.load(Path(conf_dir(), "hydra", "job_logging", "dew.yaml")))
    logging.config.dictConfig(settings)  # type: ignore[arg-type]  # a mapping of str keys, as the file is


@console_script
def main() -> None:
    args = sys.argv[1:]
    check = CHECK_FLAG in args
    args = [a for a in args if a != CHECK_FLAG]
    run = parse(Recipe, args, prog=PROG, description=DESCRIPTION)
    console_logging()
    try:
        if check:
            check_recipe(run)
        else:
            train_recipe(run)
    except KeyboardInterrupt:  # Ctrl-C twice (dew.training.preemption), or one before the set-up
        if debugging():
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
