"""Where a process stands in a SLURM job, read from the variables SLURM sets: whether it is one task
of an ``srun`` step (where JAX finds the other processes itself) and which of its node's GPUs are its
own. Pure functions of the environment, so every layout is testable without a cluster; and, asked
of the controller (``scontrol``), when the job waited in the queue (``queue_times``).

JAX's own SLURM detection takes ``SLURM_NTASKS`` for the process count and, unless told otherwise,
``[SLURM_LOCALID]`` for the local devices: right for one task per GPU with every GPU visible, wrong
for one task per node (each process would use GPU 0 alone) and for ``--gpus-per-task`` or
``--gpu-bind`` (each task sees only its own GPU, numbered 0, and task 3 would ask for device 3).
``local_device_ids`` derives them from ``CUDA_VISIBLE_DEVICES`` and the tasks on the node instead.
"""

from __future__ import annotations

import datetime
import logging
import re
import subprocess
from collections.abc import Mapping

log = logging.getLogger("dew")

SPECIAL_STEPS = 0xFFFFFFF0
"""Step ids at or above this are SLURM's pseudo-steps, not ``srun`` steps: the batch script
(0xFFFFFFFB), the extern step, and the interactive step of an ``salloc`` shell (0xFFFFFFFA)."""


def step_tasks(env: Mapping[str, str]) -> int:
    """The number of tasks of the ``srun`` step this process is one task of; 0 outside a step.

    A step is known by its own variables (``SLURM_STEP_ID`` with ``SLURM_PROCID``), not by
    ``SLURM_NTASKS``, which a batch script and an ``salloc`` shell also see: there the job's task
    count says how many processes srun *would* start, not that any other is running."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if step is None or "SLURM_PROCID" not in env or not step.isdigit() or int(step) >= SPECIAL_STEPS:
        return 0
    return int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))


def outside_step(env: Mapping[str, str]) -> str | None:
    """A sentence naming the SLURM job of several tasks this process runs in outside any ``srun``
    step (its batch script, an ``salloc`` shell); None anywhere else."""
    tasks = int(env.get("SLURM_NTASKS", "1") or 1)
    if "SLURM_JOB_ID" not in env or tasks <= 1 or step_tasks(env):
        return None
    return f"this process runs in SLURM job {env['SLURM_JOB_ID']} of {tasks} tasks but outside an srun step"


def tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed task counts, ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: not SLURM's form, e.g. '2(x3),1'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def local_device_ids(env: Mapping[str, str]) -> list[int] | None:
    """This task's GPUs, as indices into the GPUs it sees (what ``jax.distributed.initialize``
    takes as ``local_device_ids``); None when ``CUDA_VISIBLE_DEVICES`` names none (no GPUs asked
    for: JAX's own choice stands).

    - A task that sees fewer GPUs than its node has (``--gpus-per-task``, ``--gpu-bind``: the
      cgroup or the binding shows it its own alone) uses every GPU it sees.
    - A task that sees all of its node's GPUs shares them with the node's other tasks: one task
      per node uses all of them, one task per GPU its own (``SLURM_LOCALID``), ``k`` GPUs per task
      the ``k`` from ``SLURM_LOCALID * k``.
    - A split that is not even (3 GPUs, 2 tasks) is refused with the numbers.
    """
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if not visible:
        return None
    node = int(env.get("SLURM_NODEID", "0"))
    counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")
    tasks = counts[min(node, len(counts) - 1)]
    local = int(env.get("SLURM_LOCALID", "0"))
    on_node = int(env.get("SLURM_GPUS_ON_NODE") or (len(visible) if len(visible) >= tasks else 0))
    if len(visible) < on_node or on_node == 0:  # bound: these GPUs are this task's alone
        return list(range(len(visible)))
    if len(visible) % tasks:
        raise ValueError(
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} shows {len(visible)} GPUs to each "
            f"of the {tasks} tasks on node {node}, which cannot share them evenly: ask for a "
            "multiple of the tasks per node (hydra.launcher.gpus_per_node=N with tasks_per_node=N, "
            "or tasks_per_node=1), or one GPU per task (--gpus-per-task=1)"
        )
    share = len(visible) // tasks
    return list(range(local * share, (local + 1) * share))


def job_spec(env: Mapping[str, str]) -> str | None:
    """How ``scontrol`` names this process's job: ``<array job>_<task>`` for an array's task (the
    task's own id alone would name the whole array for its first task), else ``SLURM_JOB_ID``; None
    outside SLURM."""
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def job_times(shown: str) -> tuple[float, float | None] | None:
    """``SubmitTime`` and ``StartTime`` (seconds since the epoch) from ``scontrol show job``'s
    record, None where it names no submission. scontrol prints local time to the second, which
    this process's clock reads the same way (the same ``TZ``)."""

    def at(field: str) -> float | None:
        m = re.search(rf"\b{field}=(\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d)", shown)
        return None if m is None else datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").timestamp()

    submitted = at("SubmitTime")
    return None if submitted is None else (submitted, at("StartTime"))


def queue_times(env: Mapping[str, str], timeout_s: float = 10.0) -> dict[str, float]:
    """When this process's SLURM job was taken into the scheduler's queue (``queued``: its
    ``SubmitTime``, which SLURM sets again when it requeues a job) and when it was given its nodes
    (``allocated``: ``StartTime``), from ``scontrol show job``: the goodput ledger's ``queue``
    (dew.runs.goodput). SLURM sets no variable for either. Empty outside SLURM, and where the
    controller does not answer within ``timeout_s`` (said once in the log: the ledger then counts
    the wait as time between starts, or not at all before the first)."""
    spec = job_spec(env)
    if spec is None:
        return {}
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", spec], capture_output=True, text=True, timeout=timeout_s, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("SLURM job %s: scontrol show job did not say when it was queued (%s): no queue time", spec, err)
        return {}
    times = job_times(shown)
    if times is None:
        return {}
    submitted, started = times
    return {"queued": submitted, **({"allocated": started} if started is not None else {})}
