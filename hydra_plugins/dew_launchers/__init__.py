"""dew's submitit launchers, as Hydra plugins (Hydra instantiates launchers only from the
``hydra_plugins`` package): hydra-submitit-launcher's SLURM and local launchers, plus what a dew
job needs in its own process. ``launch/hydra/launcher/{slurm,local}.yaml`` select them.

A submitit job runs in a fresh Python process that unpickles the launcher and composes the job's
config again there. Two things do not travel in the pickle and are restored here: dew's OmegaConf
resolvers (OmegaConf keeps them in a process-wide table), and, for the local executor, the JAX
coordinator's address. SLURM jobs need no address: inside srun, ``jax.distributed.initialize()``
finds the cluster itself.

The local executor tells every task its rank and the task count (submitit's job environment) but
names no meeting point, and all local jobs of a sweep start at once, so each job needs its own
coordinator port: the launching process picks one free port per job (``dew.cli.launchers.
free_ports``) and the job's tasks read it from the pickled launcher. Concurrent jobs never collide,
and a requeued job (the same pickle) meets on the same port again.

The sweep's directory and swept keys are decided in the launching process (``dew.cli.train.
_sweep_name``) and travel in the pickle too (``sweep``), not through the environment, so a job
submitted with ``--export=NONE`` writes where the launching process said.

``SlurmLauncher`` adds what real sites need to hydra-submitit-launcher's: ``gres`` alone (no
``--gpus-per-node`` beside it), ``tasks_per_node`` one per GPU by default, ``--wckey`` only when
set, ``--requeue`` by default, the job named after the sweep, ``SRUN_CPUS_PER_TASK`` exported (srun
of Slurm 22.05-23.02 does not inherit ``--cpus-per-task``), and ``dry_run``: print the batch script
instead of submitting it.
"""

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra_plugins.hydra_submitit_launcher import config, submitit_launcher


def _job_process_setup() -> None:
    from dew.cli.train import register_configs

    register_configs()


class _SweepInPickle:
    """The sweep's record (``dew.cli.train.SWEEP_ENV``: its directory and swept keys), taken in the
    launching process and set again in each job's process from the pickle."""

    sweep: str | None = None

    def record_sweep(self) -> None:
        from dew.cli.train import sweep_record

        self.sweep = sweep_record(self.config)

    def restore_sweep(self) -> None:
        from dew.cli.train import SWEEP_ENV

        if self.sweep is not None:
            os.environ[SWEEP_ENV] = self.sweep


@dataclass
class DewSlurmConf(config.SlurmQueueConf):
    """The ``slurm`` profile's fields: hydra-submitit-launcher's, and dew's additions."""

    _target_: str = "hydra_plugins.dew_launchers.SlurmLauncher"
    tasks_per_node: Optional[int] = None  # type: ignore[assignment]  # noqa: UP045 - OmegaConf reads Optional
    """Processes per node; None: one per GPU (``gpus_per_node``, or the count in ``gres``), 1 without GPUs."""
    name: Optional[str] = None  # type: ignore[assignment]  # noqa: UP045
    """The SLURM job's name; None: the sweep directory's (``<trainer.name>-sweep-<digest>``)."""
    wckey: Optional[str] = None  # noqa: UP045
    """``--wckey``, emitted only when set (sites that enforce wckeys reject a made-up one)."""
    requeue: bool = True
    """``--requeue`` (false: ``--no-requeue``): sites with ``JobRequeue=0`` refuse a preempted or
    timed-out job's ``scontrol requeue`` unless the job asked for it."""
    srun_args: Optional[list[str]] = None  # noqa: UP045
    """Arguments for ``srun`` in the batch script, e.g. pyxis's ``--container-image=...``."""
    dry_run: bool = False
    """Print the batch script that would be submitted, and submit nothing."""


ConfigStore.instance().store(group="hydra/launcher", name="dew_slurm_schema", node=DewSlurmConf, provider="dew")


def gpus_in_gres(gres: str | None) -> int | None:
    """The GPU count of a ``--gres`` value: ``gpu:8`` and ``gpu:a100:8`` are 8."""
    m = re.search(r"(?:^|,)gpu(?::[\w.-]+)?:(\d+)", gres or "")
    return int(m.group(1)) if m else None


def slurm_parameters(params: dict[str, Any], sweep_dir: str) -> dict[str, Any]:
    """The launcher's fields as hydra-submitit-launcher passes them on, made what real sites need."""
    params = dict(params)
    extra = dict(params.pop("additional_parameters", None) or {})
    gpus = params.get("gpus_per_node")
    if params.get("gres"):
        params.pop("gpus_per_node", None)  # --gres alone asks for the GPUs; both conflict at some sites
        gpus = gpus_in_gres(params["gres"])
    if params.get("tasks_per_node") is None:
        params["tasks_per_node"] = gpus or 1
    params["name"] = params.get("name") or Path(sweep_dir).name
    extra.setdefault("requeue" if params.pop("requeue", True) else "no-requeue", True)
    params.pop("dry_run", None)
    if params.get("cpus_per_task"):  # srun of Slurm 22.05-23.02 does not inherit --cpus-per-task
        params["setup"] = [f"export SRUN_CPUS_PER_TASK={params['cpus_per_task']}", *(params.get("setup") or [])]
    params["additional_parameters"] = extra
    return params


class SlurmLauncher(_SweepInPickle, submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, with dew's resolvers and sweep in the job process
    and the parameters real sites need (``slurm_parameters``)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        self.record_sweep()
        dry_run = bool(self.params.get("dry_run"))
        self.params = slurm_parameters(self.params, str(self.config.hydra.sweep.dir))
        if dry_run:
            return self.print_script(job_overrides, initial_job_idx)
        return super().launch(job_overrides, initial_job_idx)

    def print_script(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Print the batch script ``launch`` would submit (one for a whole sweep: a job array) and
        each job's overrides; submit nothing."""
        from dew import compat

        names = compat.submitit_slurm_parameter_names()
        folder = str(Path(self.params["submitit_folder"]).absolute())  # as the executor makes it
        skip = {"submitit_folder", "max_num_timeout"}
        params = {names.get(k, k): v for k, v in self.params.items() if k not in skip}
        if params.get("mem") is not None:
            params["mem"] = f"{params['mem']}GB"
        if len(job_overrides) > 1:
            params["map_count"] = len(job_overrides)
        command = f"{sys.executable} -u -m submitit.core._submit {folder}"
        print(compat.submitit_sbatch_script(folder, command, **params))
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            print(f"# job {idx}: {' '.join(overrides)}")
        print(f"# dry run: nothing submitted (hydra.launcher.dry_run=true); the runs would be in "
              f"{self.config.hydra.sweep.dir}")
        return []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _job_process_setup()
        self.restore_sweep()
        return super().__call__(*args, **kwargs)


class LocalLauncher(_SweepInPickle, submitit_launcher.LocalLauncher):
    """hydra-submitit-launcher's local launcher, with dew's resolvers in the job process and one
    coordinator port per job, chosen by the launching process."""

    ports: dict[int, int]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from dew.cli.launchers import free_ports

        self.ports = free_ports(len(job_overrides), first=initial_job_idx)
        self.record_sweep()
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, *args: Any) -> Any:
        _job_process_setup()
        self.restore_sweep()
        os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{self.ports[job_num]}"
        return super().__call__(sweep_overrides, job_dir_key, job_num, *args)
