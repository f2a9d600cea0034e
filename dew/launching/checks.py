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

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

from dew.launching.jobs import SweepJob, hydra_config


def check_job(job: SweepJob, device_count: int | None) -> None:
    """Raise ``ConfigError``/``ValueError``/``OSError`` with the message a single run would print,
    for any problem the job's run would find before writing anything."""
    from dew.recipe import Recipe

    with hydra_config(job.hydra):
        container = OmegaConf.to_container(job.config, resolve=True)
    recipe = job.recipe = Recipe.from_dict(container)  # before JAX is imported: a typo fails at once
    from dew.build import build_run
    from dew.training.preflight import check_checkpoint_dir, check_xla_flags
    from dew.training.trainer import check

    check_xla_flags(recipe.trainer)
    recipe, objective, dataset = build_run(recipe)
    check(recipe, objective, dataset, device_count=device_count or _known_devices(recipe))
    check_checkpoint_dir(recipe.trainer, job.run_dir)


def _known_devices(recipe: Any) -> int:
    """Where the launcher cannot know the device count: the product of the mesh's fixed sizes."""
    sizes = [s for s in dataclasses.asdict(recipe.trainer.mesh).values() if s != -1]
    count = 1
    for s in sizes:
        count *= s
    return count


def failures(jobs: Sequence[SweepJob], device_count: int | None) -> list[str]:
    """One line per job that fails its checks: the job, its overrides and the message."""
    from dew.contract.typed import ConfigError

    lines = []
    for job in jobs:
        try:
            check_job(job, device_count)
        except (ConfigError, ValueError, OSError) as err:
            lines.append(f"{job.describe()}: {err}")
    return lines


def launcher_without_multirun(args: Any) -> str | None:
    """A launcher chosen on a single run, where Hydra would ignore it and train right here (on a
    cluster's login node): the sentence that says so and how to launch. ``--cfg``, ``--info`` and
    ``--help`` only show the config, and may."""
    chosen = [o for o in args.overrides if re.fullmatch(r"\+*hydra/launcher=\S+", o)]
    if not chosen or args.multirun or args.cfg or args.info or args.help or args.hydra_help:
        return None
    return (f"{chosen[0]} takes effect only on a multirun: without -m Hydra ignores the launcher and trains "
            f"in this process; run: dew-train -m {' '.join(args.overrides)}")
