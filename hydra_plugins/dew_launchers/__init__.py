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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher


def _job_process_setup() -> None:
    from dew.cli.train import register_configs

    register_configs()


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, with dew's resolvers in the job process."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _job_process_setup()
        return super().__call__(*args, **kwargs)


class LocalLauncher(submitit_launcher.LocalLauncher):
    """hydra-submitit-launcher's local launcher, with dew's resolvers in the job process and one
    coordinator port per job, chosen by the launching process."""

    ports: dict[int, int]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from dew.cli.launchers import free_ports

        self.ports = free_ports(len(job_overrides), first=initial_job_idx)
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, *args: Any) -> Any:
        _job_process_setup()
        os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{self.ports[job_num]}"
        return super().__call__(sweep_overrides, job_dir_key, job_num, *args)
