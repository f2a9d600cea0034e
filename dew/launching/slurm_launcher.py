"""What dew's SLURM launcher (``hydra/launcher=slurm``) adds to hydra-submitit-launcher's: dew's
resolvers and the sweep's record in the job's process, every job checked before any is queued
(``SubmititLaunch``), and what real sites need: ``gres`` alone (no ``--gpus-per-node`` beside it),
``tasks_per_node`` one per GPU by default, ``--wckey`` only when set, ``--requeue`` by default, the
job named after the sweep, ``SRUN_CPUS_PER_TASK`` exported (srun of Slurm 22.05-23.02 does not
inherit ``--cpus-per-task``), and ``dry_run``: print the batch script instead of submitting it.
SLURM jobs need no coordinator address: inside srun, ``jax.distributed.initialize()`` finds the
cluster itself (``dew.launching.pool``)."""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dew import compat
from dew.launching.launchers import SubmititLaunch, job_process_setup, searching
from dew.launching.naming import SweepInPickle

MAX_ARRAY_SIZE = 1001
"""Slurm's default ``MaxArraySize`` (slurm.conf), where ``scontrol show config`` does not say."""


def max_array_size() -> int:
    """The site's ``MaxArraySize`` (the most jobs one array may hold), from ``scontrol show config``."""
    import subprocess

    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return MAX_ARRAY_SIZE
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", shown, re.M)
    return int(found.group(1)) if found else MAX_ARRAY_SIZE


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


def batch_script(params: dict[str, Any], folder: str, command: str, map_count: int | None) -> str:
    """The batch script for the launcher's parameters (``slurm_parameters``' result), the job folder
    submitit writes to, the command each task runs and the array's size (None: one job). The one
    function behind both the script a dry run prints and the script ``sbatch`` receives
    (``compat.submitit_slurm_script``). ``--wckey`` appears only when ``wckey`` is set: submitit's
    executor drops a ``None`` and puts back its own default, ``submitit``."""
    names = compat.submitit_slurm_parameter_names()
    script = {names.get(k, k): v for k, v in params.items() if k not in ("submitit_folder", "max_num_timeout")}
    script = {k: v for k, v in script.items() if v is not None}
    if "mem" in script:
        script["mem"] = compat.submitit_mem(script["mem"])
    script.setdefault("wckey", None)
    if map_count is not None:
        script["map_count"] = map_count
    return compat.submitit_sbatch_script(folder, command, **script)


class SlurmLaunch(SweepInPickle, SubmititLaunch):
    """hydra-submitit-launcher's SLURM launcher, with dew's resolvers and sweep in the job process,
    the parameters real sites need (``slurm_parameters``) and dew's batch script (``batch_script``).
    A mixin before hydra-submitit-launcher's ``SlurmLauncher``."""

    params: dict[str, Any]
    given: dict[str, Any] | None = None
    """The launcher's fields as configured (``params`` is remade from them at every launch: a
    search launches once per batch of trials)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        self.record_sweep()
        if self.given is None:
            self.given = dict(self.params)
        self.dry_run = bool(self.given.get("dry_run"))
        self.params = slurm_parameters(self.given, str(self.config.hydra.sweep.dir))
        return super().launch(job_overrides, initial_job_idx)  # the checks, then start_and_wait

    @contextlib.contextmanager
    def refilling(self) -> Iterator[None]:
        """A refilled search's set-up (``dew.launching.refill``): the parameters and batch script of
        ``launch`` and ``start_and_wait``, once for the whole search."""
        self.record_sweep()
        if self.given is None:
            self.given = dict(self.params)
        self.params = slurm_parameters(self.given, str(self.config.hydra.sweep.dir))
        with super().refilling(), compat.submitit_slurm_script(functools.partial(batch_script, self.params)):
            yield None

    def submit_workers(self, worker: Any, count: int) -> list[str]:
        """Submit ``count`` jobs of ``worker`` (``dew.launching.search.study_workers.StudyWorker``, called with its
        index) as job arrays of at most the site's ``MaxArraySize`` jobs, with this launcher's
        parameters and batch script; their SLURM job ids. Nothing waits for them."""
        from dew.launching.search.study_workers import array_chunks

        with self.refilling():
            executor = self.executor()
            ids = []
            for chunk in array_chunks(count, max_array_size()):
                ids += [job.job_id for job in executor.map_array(worker, list(chunk))]
        return ids

    def launcher_problem(self) -> str | None:
        if self.dry_run:  # prints the script: no cluster needed
            return None
        missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
        if not missing:
            return None
        return (
            f"hydra/launcher=slurm: {' and '.join(missing)} not found on PATH: this machine is not a SLURM "
            "login node. Submit from one, or see the batch script with hydra.launcher.dry_run=true"
        )

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        if self.dry_run:  # checked as a submission is, and then only printed
            return self.print_script(job_overrides, initial_job_idx)
        with compat.submitit_slurm_script(functools.partial(batch_script, self.params)):
            return super().start_and_wait(job_overrides, initial_job_idx)

    def print_script(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Print the batch script ``launch`` would submit (one for a whole sweep: a job array; for a
        search, the one each trial's job gets) and each job's overrides; submit nothing."""
        folder = str(Path(self.params["submitit_folder"]).expanduser().absolute())  # as the executor makes it
        search = searching(self.config)  # a search's trials are jobs of their own (dew.launching.refill)
        count = len(job_overrides) if len(job_overrides) > 1 and not search else None
        print(batch_script(self.params, folder, compat.submitit_slurm_command(folder), count))
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            print(f"# job {idx}: {' '.join(overrides)}")
        if search:
            print(
                f"# a search: each trial is a job of its own with this script, {len(job_overrides)} at a time "
                "(hydra.sweeper.n_jobs), the next submitted as soon as one ends"
            )
        print(
            f"# dry run: nothing submitted (hydra.launcher.dry_run=true); the runs would be in "
            f"{self.config.hydra.sweep.dir}"
        )
        return []

    def requested_devices(self) -> int | None:
        """Every node's GPUs (``gpus_per_node``, or the count in ``gres``), where they are known."""
        nodes = self.params.get("nodes")
        gpus = self.params.get("gpus_per_node") or gpus_in_gres(self.params.get("gres"))
        return nodes * gpus if isinstance(nodes, int) and isinstance(gpus, int) and gpus > 0 else None

    def requested_processes(self) -> int | None:
        """Every node's tasks (``nodes`` x ``tasks_per_node``), where both are set."""
        nodes, tasks = self.params.get("nodes"), self.params.get("tasks_per_node")
        return nodes * tasks if isinstance(nodes, int) and isinstance(tasks, int) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job_process_setup(kwargs.get("singleton_state", args[-1]))  # hydra-submitit-launcher's last argument
        self.restore_sweep()
        return super().__call__(*args, **kwargs)  # type: ignore[misc]
