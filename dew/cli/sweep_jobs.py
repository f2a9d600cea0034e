"""A sweep's jobs as the launching process sees them, before anything is queued: each job's config
composed and converted, its run directory, and the checks a single run makes before it writes
anything. dew's launchers (``hydra_plugins.dew_launchers``) run them on the whole job list first,
so a bad value is refused in seconds on the login node instead of after the queue wait in every
task's log, and a sweep whose jobs are alive is not submitted twice.

The launching process opens no JAX backend (a login node may have no accelerator, and the basic
launcher's jobs, which run in this process, must still set XLA's flags and join their pool): the
mesh is checked as an abstract mesh over the devices the launcher requests (SLURM: nodes x GPUs
per node; local: tasks x the CPU devices each task simulates), and the model and the optimizer only
as shapes.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write


@dataclasses.dataclass
class SweepJob:
    """One job of a sweep, as the launching process composed it."""

    num: int
    overrides: list[str]
    """The job's overrides, as Hydra passes them to the launcher."""
    config: DictConfig
    """The task's config (without the ``hydra`` node), as the job's task function will receive it."""
    run_dir: str
    """Its run directory: the sweep's directory and the job's subdirectory."""
    hydra: DictConfig
    """The job's whole config, ``hydra`` node included."""
    recipe: Any = None
    """The job's converted config, once ``check_job`` has converted it."""

    def describe(self) -> str:
        """``job 0 (optim.learning_rate=0.001 trainer.name=x)``"""
        from hydra.core.utils import filter_overrides

        return f"job {self.num} ({' '.join(filter_overrides(self.overrides))})"


@contextmanager
def _hydra_config(cfg: DictConfig) -> Iterator[None]:
    """Within: ``HydraConfig`` is ``cfg``'s (``${hydra:...}`` resolves as in the job), restored after."""
    from hydra.core.hydra_config import HydraConfig

    instance = HydraConfig.instance()
    previous = instance.cfg
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = previous


def compose_jobs(config: DictConfig, hydra_context: Any, job_overrides: Sequence[Sequence[str]],
                 initial_job_idx: int) -> list[SweepJob]:
    """Every job's config and run directory, composed as each job will compose its own."""
    jobs = []
    for offset, overrides in enumerate(job_overrides):
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.num = initial_job_idx + offset
        with _hydra_config(sweep_config):
            run_dir = os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))
        task = copy.deepcopy(sweep_config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        jobs.append(SweepJob(initial_job_idx + offset, list(overrides), task, run_dir, sweep_config))
    return jobs


def check_job(job: SweepJob, device_count: int | None) -> None:
    """Raise ``ConfigError``/``ValueError``/``OSError`` with the message a single run would print,
    for any problem the job's run would find before writing anything."""
    from dew.recipe import Recipe

    with _hydra_config(job.hydra):
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


def stop_record(job: SweepJob) -> dict[str, Any] | None:
    """The last ``stop`` or ``end`` event of the job's journal, None if it has none (or no journal)."""
    from dew.training.tracking import read_journal, tracking_dir

    if job.recipe is None:
        return None
    name = os.path.relpath(job.run_dir, job.recipe.trainer.checkpoint_dir)
    try:
        records = read_journal(tracking_dir(job.recipe.trainer) / name / "journal.jsonl")
    except OSError:
        return None
    return next((r for r in reversed(records) if r.get("event") in ("stop", "end", "resume", "start")), None)
