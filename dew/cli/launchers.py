"""What dew's submitit launchers (``hydra_plugins/dew_launchers``) share with ``dew-train``: a
free coordinator port per local job, and the exit after a run stopped on a signal. What the
launchers do with a sweep's job list is ``dew.cli.sweep_launch``."""

from __future__ import annotations

import os
import socket
import sys
from typing import NoReturn

from dew import compat


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


def exit_after_stop(signum: int | None) -> NoReturn:
    """Exit as the launcher expects once a run stopped on ``signum`` and saved its checkpoint.

    In a submitit job stopped by submitit's own signal (SIGUSR2, to this process or to any other
    of its pool: the processes agree on the signal, ``dew.training.preemption``), submitit's handler, which the
    trainer held back until the checkpoint was saved, now does what it always does: on rank 0 it
    dumps the job again (the launcher's ``checkpoint``: the same job, so the same run directory)
    and requeues it (``scontrol requeue`` on SLURM; exit status 144, which makes the local
    executor's controller start the tasks again), then exits; on the other ranks it returns. Every
    rank waits at a barrier until rank 0 has requeued, so no task ends the job before that.

    Anywhere else the status is 128 + the signal's number, what a shell reports for a process the
    signal ended (130 for Ctrl-C, 140 for SIGUSR2, 143 for SIGTERM), so a scheduler or a script
    sees a run that did not complete.
    """
    import signal

    signum = signum or signal.SIGTERM
    handler = signal.getsignal(signum)
    if os.environ.get("SUBMITIT_EXECUTOR"):
        if signum == compat.submitit_requeue_signal() and compat.submitit_requeue_handler(handler):
            try:
                handler(signum, None)
            finally:
                _barrier("dew/requeued")
    _exit(128 + signum)


def _exit(status: int) -> NoReturn:
    """Exit with ``status`` once a stopped run saved, closed and released all it holds. A single
    ``dew-train`` run alone in its process (no JAX pool, no submitit job, no sweep in this process)
    leaves at once: the interpreter's own teardown (the XLA client and its thread pools) takes about
    half a second after the save, time a preempted job may not have (measured: a SIGINT-to-exit of
    2.6 s at 0.9 s steps, 0.55 s of it teardown; docs/performance.md, "Stopping"). Anywhere else the
    usual exit, whose clean-up others wait for (the pool's shutdown, a sweep's locks)."""
    import logging

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    alone = (not os.environ.get("SUBMITIT_EXECUTOR") and compat.jax_distributed_client() is None
             and HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN)
    if not alone:
        sys.exit(status)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _barrier(name: str, timeout_s: float = 120) -> None:
    import jax

    client = compat.jax_distributed_client()
    if client is not None and jax.process_count() > 1:
        client.wait_at_barrier(name, int(timeout_s * 1000))
