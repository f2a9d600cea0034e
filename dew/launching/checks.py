"""What is checked before anything is queued. Every job of a sweep is checked as a single run
would check it before it writes anything, in the launching process, by every dew launcher
(``dew.launching.launchers``), so a bad value is refused in seconds on the login node instead of
after the queue wait in every task's log; and a launcher chosen without ``-m``, which Hydra would
ignore, is refused before Hydra starts.

The launching process opens no JAX backend (a login node may have no accelerator, and the basic
launcher's jobs, which run in this process, must still set XLA's flags and join their pool): the
mesh is checked as an abstract mesh over the devices the launcher requests (SLURM: nodes x GPUs
per node; local: tasks x the CPU devices each task simulates), and the model and the optimizer only
as shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Sequence

from omegaconf import OmegaConf

from dew.build import build_run
from dew.contract.config import RunConfig
from dew.contract.lock import RunLockedError
from dew.contract.typed import ConfigError
from dew.launching.jobs import SweepJob, hydra_config
from dew.recipe import Recipe
from dew.training.preflight import check_xla_flags
from dew.training.run_directory import refuse_if_held

CHECK_FLAG = "--check"
"""``dew-train --check ...``: every check a launch makes, for a run, a sweep or a study's first
trials, and nothing trained, queued or written (docs/launching.md, "Checking before launching")."""

_checking = False
_checked: list[int] = []


def check_only(on: bool = True) -> None:
    """Make this process's launch a check (``dew-train --check``)."""
    global _checking
    _checking = on
    _checked.clear()


def checking() -> bool:
    """Whether this process only checks (``dew-train --check``)."""
    return _checking


def record_checked(count: int) -> None:
    """Count jobs that passed every check (the summary ``dew-train --check`` prints at its end)."""
    _checked.append(count)


def checked() -> int:
    """How many jobs passed every check in this process."""
    return sum(_checked)


def check_job(job: SweepJob, device_count: int | None, process_count: int | None = None) -> None:
    """Raise ``ConfigError``/``ValueError``/``OSError`` with the message a single run would print,
    for any problem the job's run would find before writing anything."""
    with hydra_config(job.hydra):
        container = OmegaConf.to_container(job.config, resolve=True)
    job.recipe = Recipe.from_dict(container)  # before JAX is imported: a typo fails at once
    check_run(job.recipe, job.run_dir, device_count, process_count)


def check_run(recipe: RunConfig, run_dir: str, device_count: int | None, process_count: int | None = None) -> None:
    """Every check a run makes before it writes anything, for the run ``recipe`` in ``run_dir``:
    the XLA flags, the data (present, sized), the model and the optimizer as shapes, the run's
    length against its warmup and cadences, the mesh over ``device_count`` devices (the mesh's
    fixed sizes where the count is unknown) and the batch's rows over the job's ``process_count``
    processes (where the mesh's size is known), the checkpoint directory, and a run directory that
    already holds another run's record or is held by a live process. Reads only."""
    from dew.training.setup import check, check_run_dir  # heavy: JAX stays out of composing and launching until then

    check_xla_flags(recipe.trainer)
    if process_count is not None and process_count > 1 and recipe.trainer.multi_host is False:
        raise ValueError(
            f"trainer.multi_host=false: each of the job's {process_count} processes would train its own "
            "copy of the run in the same run directory, which takes one writer; leave trainer.multi_host "
            "unset (or true) to train one run across them, or start one task a job"
        )
    recipe, objective, dataset = build_run(recipe)
    # With the device count unknown, a mesh that fills an axis (-1) has an unknown size: the rows
    # over the processes are the run's own check then.
    sized = device_count is not None or -1 not in dataclasses.asdict(recipe.trainer.mesh).values()
    check(
        recipe,
        objective,
        dataset,
        device_count=device_count or _known_devices(recipe),
        process_count=process_count if sized else None,
    )
    refuse_if_held(run_dir)
    check_run_dir(recipe, objective, dataset, os.path.relpath(run_dir, recipe.trainer.checkpoint_dir), main=True)


def _known_devices(recipe: RunConfig) -> int:
    """Where the launcher cannot know the device count: the product of the mesh's fixed sizes."""
    sizes = [s for s in dataclasses.asdict(recipe.trainer.mesh).values() if s != -1]
    count = 1
    for s in sizes:
        count *= s
    return count


def failures(jobs: Sequence[SweepJob], device_count: int | None, process_count: int | None = None) -> list[str]:
    """One line per job that fails its checks: the job, its overrides and the message
    (``device_count`` and ``process_count``: what each job gets, where the launcher knows)."""
    lines = []
    for job in jobs:
        if job.problem:  # Hydra could not compose it
            lines.append(f"{job.describe()}: {job.problem}")
            continue
        try:
            check_job(job, device_count, process_count)
        except (ConfigError, ValueError, OSError, RunLockedError) as err:
            lines.append(f"{job.describe()}: {err}")
    return lines


def launcher_without_multirun(args: argparse.Namespace) -> str | None:
    """A launcher chosen on a single run, where Hydra would ignore it and train right here (on a
    cluster's login node): the sentence that says so and how to launch. ``--cfg``, ``--info`` and
    ``--help`` only show the config, and may."""
    chosen = [o for o in args.overrides if re.fullmatch(r"\+*hydra/launcher=\S+", o)]
    if not chosen or args.multirun or args.cfg or args.info or args.help or args.hydra_help:
        return None
    return (
        f"{chosen[0]} takes effect only on a multirun: without -m Hydra ignores the launcher and trains "
        f"in this process; run: dew-train -m {' '.join(args.overrides)}"
    )
