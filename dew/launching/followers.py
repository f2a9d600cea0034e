"""``dew-eval RUN --follow --launch PROFILE``: the follower submitted as a job of its own under a
launch profile (``launch/hydra/launcher/{local,slurm}.yaml``), with the settings a dew-train job gets
there: the profile's fields, overridden as ``hydra.launcher.FIELD=VALUE`` (partition, account, time,
setup lines, ``--requeue``...), through submitit, and for SLURM through dew's batch script
(``dew.launching.slurm_launcher.batch_script``).

A follower is one process on one node (the steps appear to each process at its own moment): the
profile's ``tasks_per_node`` (one per GPU for dew-train) is 1 here, and a request for more nodes or
tasks is refused. The job's callable is the caller's (``dew.inference.following.FollowJob``: a
launcher imports no inference); submitit asks it, at SIGUSR2 (``signal_delay_s`` before the time
limit, or a preemption), for what to run when the job is requeued: the same follower, which resumes
from its record. The submitting command returns once the job is queued; the job's files (submitit's
pickles and its log) are in ``RUN/eval/follow-jobs/``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from dew import compat
from dew.launching.slurm_launcher import batch_script, slurm_parameters

PROFILES = ("local", "slurm")
"""The launch profiles a follower may be submitted under (``launch/hydra/launcher/``)."""

PROFILE_KEY = "hydra.launcher."
"""What an override of the profile's fields starts with (after ``+``, ``++`` or ``~``)."""

BASE_FIELDS = frozenset(
    ("timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name", "stderr_to_stdout")
)
"""The fields every submitit executor takes under their own name (hydra-submitit-launcher's
``BaseQueueConf``); the SLURM executor takes the others prefixed ``slurm_``, as that launcher passes them."""


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the follower's own overrides, the profile's ``hydra.launcher.*`` ones)."""
    profile = [o for o in overrides if o.lstrip("+~").startswith(PROFILE_KEY)]
    return [o for o in overrides if o not in profile], profile


def profile(name: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The launch profile ``name``'s fields with ``overrides``, composed as dew-train composes
    ``hydra/launcher=NAME`` (the same files, the same schema, the same errors for a bad field)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs

    if name not in PROFILES:
        raise ValueError(f"--launch {name}: a follower is launched under one of {', '.join(PROFILES)}")
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose(
                config_name="config", overrides=[f"hydra/launcher={name}", *overrides], return_hydra_config=True
            )
        fields = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(fields, dict)
    return {str(k): v for k, v in fields.items()}


def one_process(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` for one process on one node; more nodes or tasks refused, naming the field."""
    for field in ("nodes", "tasks_per_node"):
        if fields.get(field) not in (None, 1):
            raise ValueError(
                f"hydra.launcher.{field}={fields[field]}: a follower is one process (the steps appear to each "
                f"process at its own moment); set it to 1, or leave {field} to the follower"
            )
    return {**fields, "nodes": 1, "tasks_per_node": 1}


def submit(job: Callable[[], object], name: str, fields: dict[str, Any], folder: str, job_name: str) -> Any:
    """Submit ``job`` under the profile ``name`` with ``fields`` (``profile``'s), its files in
    ``folder``; the submitit job (``job_id``, ``paths.stdout``). Nothing waits for it. With
    ``hydra.launcher.dry_run=true`` (slurm), the batch script is printed and None returned."""
    import submitit

    fields = one_process(fields)
    fields.pop("_target_", None)
    fields["submitit_folder"] = os.path.join(folder, "%j")
    if name == "slurm":
        params = slurm_parameters({**fields, "name": fields.get("name") or job_name}, folder)
        if fields.get("dry_run"):  # the batch script the job would get, and nothing submitted
            jobs = os.path.abspath(params["submitit_folder"])
            print(batch_script(params, jobs, compat.submitit_slurm_command(jobs), None))
            print(
                f"# dry run: nothing submitted (hydra.launcher.dry_run=true); the follower's files would be in {folder}"
            )
            return None
    else:
        params = {k: v for k, v in fields.items() if k in BASE_FIELDS | {"submitit_folder", "max_num_timeout"}}
        params["name"] = params.get("name") or job_name
    executor = submitit.AutoExecutor(
        folder=params["submitit_folder"],
        cluster=name,
        **({f"{name}_max_num_timeout": params["max_num_timeout"]} if "max_num_timeout" in params else {}),
    )
    given = {k: v for k, v in params.items() if k not in ("submitit_folder", "max_num_timeout")}
    executor.update_parameters(**{k if k in BASE_FIELDS else f"{name}_{k}": v for k, v in given.items()})
    if name != "slurm":
        return executor.submit(job)
    with compat.submitit_slurm_script(functools.partial(batch_script, params)):  # dew's script, as dew-train's jobs
        return executor.submit(job)
