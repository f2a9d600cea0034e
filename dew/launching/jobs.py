"""A sweep's jobs as the launching process sees them, before anything is queued: each job's config
composed and converted as the job will compose its own, and its run directory; and, after the jobs
ran, how each one ended (its journal's last event). ``dew.launching.checks`` checks them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, open_dict, read_write

from dew.contract.journal import JournalError, read_journal
from dew.training.reporting.tracker import tracking_dir

if TYPE_CHECKING:
    from hydra.types import HydraContext


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
    """The job's converted config, once ``dew.launching.checks.check_job`` has converted it."""
    problem: str | None = None
    """Why Hydra could not compose the job (an override it cannot merge); its ``config`` and
    ``hydra`` are then the sweep's, and its ``run_dir`` the sweep's directory."""

    def describe(self) -> str:
        """``job 0 (optim.learning_rate=0.001 trainer.name=x)``"""
        from hydra.core.utils import filter_overrides

        return f"job {self.num} ({' '.join(filter_overrides(self.overrides))})"


@contextmanager
def hydra_config(cfg: DictConfig) -> Iterator[None]:
    """Within: ``HydraConfig`` is ``cfg``'s (``${hydra:...}`` resolves as in the job), restored after."""
    from hydra.core.hydra_config import HydraConfig

    instance = HydraConfig.instance()
    previous = instance.cfg
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = previous


def compose_jobs(
    config: DictConfig, hydra_context: HydraContext, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[SweepJob]:
    """Every job's config and run directory, composed as each job will compose its own."""
    from hydra.errors import HydraException

    jobs = []
    for offset, overrides in enumerate(job_overrides):
        try:
            sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        except HydraException as err:  # the job fails as it would in its own process: one line
            jobs.append(
                SweepJob(
                    initial_job_idx + offset,
                    list(overrides),
                    config,
                    str(config.hydra.sweep.dir),
                    config,
                    problem=_first_lines(err),
                )
            )
            continue
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.num = initial_job_idx + offset
        with hydra_config(sweep_config):
            run_dir = os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))
        task = copy.deepcopy(sweep_config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        jobs.append(SweepJob(initial_job_idx + offset, list(overrides), task, run_dir, sweep_config))
    return jobs


def _first_lines(err: BaseException) -> str:
    """Hydra's message and the first line of its cause (``Error merging override x=1.5``: ``Value
    '1.5' could not be converted to Integer``), on one line."""
    lines = [str(e).strip().splitlines()[0] for e in (err, err.__cause__) if e is not None and str(e).strip()]
    return ": ".join(lines)


def stop_record(job: SweepJob) -> dict[str, Any] | None:
    """The last ``stop`` or ``end`` event of the job's journal, None if it has none (or no journal)."""
    if job.recipe is None:
        return None
    name = os.path.relpath(job.run_dir, job.recipe.trainer.checkpoint_dir)
    try:
        records = read_journal(tracking_dir(job.recipe.trainer) / name / "journal.jsonl")
    except (OSError, JournalError):
        return None
    return next((r for r in reversed(records) if r.get("event") in ("stop", "end", "resume", "start")), None)
