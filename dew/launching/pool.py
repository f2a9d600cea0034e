"""The JAX process pool a run's processes form (multi-host): whether to join it
(``trainer.multi_host``), what ``jax.distributed.initialize`` cannot find itself, process 0's answer
on every process, a barrier, and the coordinator ports the local launcher hands its jobs."""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

from dew import compat
from dew.launching import slurm

log = logging.getLogger("dew")

HEARTBEAT_ENV = "DEW_HEARTBEAT_TIMEOUT_S"
"""Seconds without a heartbeat after which JAX's coordination service declares a process dead and
stops the others (jax.distributed.initialize's heartbeat_timeout_seconds; JAX's own default, 100 s,
when unset). A property of the cluster, not of the run: an environment variable, not a field."""


def _submitit_local_tasks() -> int:
    """The task count of the submitit local-executor job this process runs in; 0 outside one."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local":
        return 0
    import submitit

    return submitit.JobEnvironment().num_tasks


def _cluster_configured() -> bool:
    env = os.environ
    return (
        "JAX_COORDINATOR_ADDRESS" in env
        or slurm.step_tasks(env) > 1
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or _submitit_local_tasks() > 1
    )


def _pool_arguments() -> dict[str, Any]:
    """What jax.distributed.initialize cannot find itself. Inside an srun step (SLURM, submitit's
    SLURM executor included) it finds the coordinator, the process count and the rank, but not
    which of the node's GPUs are this process's (``dew.launching.slurm.local_device_ids``); under
    Open MPI it detects everything; submitit's local executor tells each task its rank and the
    task count through its job environment, and dew's local launcher the coordinator's address
    (``free_ports``, dew.launching.local_launcher)."""
    args: dict[str, object] = {}
    if os.environ.get("SUBMITIT_EXECUTOR") == "local":
        import submitit

        job = submitit.JobEnvironment()
        args.update(num_processes=job.num_tasks, process_id=job.global_rank)
        # The local executor shows every task all the job's GPUs; one GPU per task, as under srun.
        gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        if len(gpus) == job.num_tasks:
            args["local_device_ids"] = [job.local_rank]
    elif slurm.step_tasks(os.environ) and (devices := slurm.local_device_ids(os.environ)) is not None:
        args["local_device_ids"] = devices
    if timeout := os.environ.get(HEARTBEAT_ENV):
        try:
            args["heartbeat_timeout_seconds"] = int(timeout)
        except ValueError:
            raise ValueError(f"{HEARTBEAT_ENV}={timeout!r} must be a whole number of seconds") from None
    return args


def joins_a_pool(multi_host: bool | None) -> bool:
    """Whether ``join_process_pool(multi_host)`` would join a pool of processes here (then the
    devices a run trains on are known only once every process has joined)."""
    if multi_host is False or slurm.outside_step(os.environ):
        return False
    return bool(multi_host) or _cluster_configured()


def join_process_pool(multi_host: bool | None) -> None:
    """Join the pool as ``trainer.multi_host`` asks: ``None`` when a cluster is configured, ``True``
    always (failing loudly), ``False`` never. Before JAX opens a backend."""
    import jax

    if multi_host is False or compat.jax_distributed_client() is not None:
        return
    if outside := slurm.outside_step(os.environ):  # a batch script or an salloc shell, not srun
        if multi_host:
            raise ValueError(
                f"trainer.multi_host=true: {outside}; JAX finds the other processes only inside "
                "`srun`: run `srun dew-train ...` in the allocation, or submit with "
                "`dew-train -m hydra/launcher=slurm ...`"
            )
        log.info("%s: training alone in this process (srun dew-train ... trains on all of them)", outside)
        return
    if multi_host is None and not _cluster_configured():
        return
    args = _pool_arguments()
    try:
        jax.distributed.initialize(**args)
    except Exception as err:
        raise RuntimeError(f"trainer.multi_host={multi_host}: could not join the JAX process pool: {err}") from err
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # the CPUs srun gave
    log.info(
        "joined the JAX process pool: process %d of %d (local devices %s, %d CPUs)",
        jax.process_index(),
        jax.process_count(),
        args.get("local_device_ids", "JAX's choice"),
        cpus,
    )


def from_process_zero(key: str, value: object, *, timeout_s: float = 3600) -> Any:
    """Process 0's ``value`` (JSON), on every process; ``value`` itself when running alone.

    What a process resolves for itself (a time-stamped run name, a ``${now:}`` in the config) may
    differ between processes that started a second apart; the run must be one run, so process 0
    decides and the others take its answer from the coordination service's key-value store (no
    device computation, no collective on the accelerators). The wait is long (process 0 may be
    downloading the data) but never a hang: a process 0 that dies stops the others through JAX's
    heartbeat."""
    import jax

    client = compat.jax_distributed_client()
    if client is None or jax.process_count() == 1:
        return value
    key = f"dew/{key}"
    if jax.process_index() == 0:
        client.key_value_set(key, json.dumps(value))
        return value
    return json.loads(client.blocking_key_value_get(key, int(timeout_s * 1000)))


def barrier(name: str, timeout_s: float = 120) -> None:
    """Wait until every process of the pool reached the barrier ``name``; nothing outside a pool."""
    import jax

    client = compat.jax_distributed_client()
    if client is not None and jax.process_count() > 1:
        client.wait_at_barrier(name, int(timeout_s * 1000))


def free_ports(count: int, *, first: int = 0) -> dict[int, int]:
    """``count`` distinct free TCP ports on this machine, keyed ``first``, ``first + 1``, ...: all
    sockets stay bound until every port is chosen, so no two are the same."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return {first + i: s.getsockname()[1] for i, s in enumerate(sockets)}
    finally:
        for s in sockets:
            s.close()
