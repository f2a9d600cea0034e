"""dew's launchers, as Hydra plugins (Hydra instantiates launchers only from the ``hydra_plugins``
package): Hydra's basic launcher and hydra-submitit-launcher's SLURM and local launchers, each of
which checks every job of a sweep before it starts any (``dew.cli.launchers.CheckedLaunch``), plus
what a dew job needs in its own process. ``launch/hydra/launcher/{dew_basic,slurm,local}.yaml``
select them; ``dew_basic`` is dew's default.

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

from hydra._internal.core_plugins.basic_launcher import BasicLauncher as _HydraBasicLauncher
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from dew.cli.launchers import CheckedLaunch, SubmititLaunch


def _job_process_setup() -> None:
    from dew.cli.train import register_configs
    from dew.training.preemption import install_early

    install_early()  # a signal during set-up or restore is the run's, not submitit's (preemption.py)
    register_configs()


class BasicLauncher(CheckedLaunch, _HydraBasicLauncher):
    """Hydra's basic launcher (the jobs one after another, in this process), every job checked
    before the first starts: dew's default launcher (conf/config.yaml)."""


class SlurmLauncher(SubmititLaunch, submitit_launcher.SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, with dew's resolvers in the job process."""

    def requested_devices(self) -> int | None:
        nodes, gpus = self.params.get("nodes"), self.params.get("gpus_per_node")
        return nodes * gpus if isinstance(nodes, int) and isinstance(gpus, int) and gpus > 0 else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _job_process_setup()
        return super().__call__(*args, **kwargs)


class LocalLauncher(SubmititLaunch, submitit_launcher.LocalLauncher):
    """hydra-submitit-launcher's local launcher, with dew's resolvers in the job process and one
    coordinator port per job, chosen by the launching process. Ctrl-C in the terminal reaches the
    tasks, which save and stop, while the launcher waits for them (``interrupted``); a launcher
    that dies takes its jobs with it (``dew.cli.launchers.watch_launcher``)."""

    ports: dict[int, int]
    launcher_pid: int

    def requested_devices(self) -> int | None:
        tasks = self.params.get("tasks_per_node")
        cpu_devices = int(os.environ.get("JAX_NUM_CPU_DEVICES", "1"))
        on_cpu = os.environ.get("JAX_PLATFORMS", "") == "cpu" or not self.params.get("gpus_per_node")
        known = isinstance(tasks, int) and on_cpu and "JAX_NUM_CPU_DEVICES" in os.environ
        return tasks * cpu_devices if known else None

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from dew import compat
        from dew.cli.launchers import free_ports

        self.ports = free_ports(len(job_overrides), first=initial_job_idx)
        self.launcher_pid = os.getpid()
        self.controllers: list[Any] = []
        with compat.submitit_local_controllers(self.controllers):
            return super().start_and_wait(job_overrides, initial_job_idx)

    def interrupted(self) -> bool:
        from dew.cli.launchers import wait_for_controllers

        wait_for_controllers(self.controllers)
        return True

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "controllers"}  # processes do not pickle

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, *args: Any) -> Any:
        from dew.cli.launchers import watch_launcher

        _job_process_setup()
        watch_launcher(self.launcher_pid)
        os.environ["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{self.ports[job_num]}"
        return super().__call__(sweep_overrides, job_dir_key, job_num, *args)
