"""How a process leaves once its run stopped on a signal and saved its checkpoint: submitit's requeue
handshake (rank 0 requeues, every rank waits for it), or the status a shell reports for a process the
signal ended; and, for a run alone in its process, at once, without the interpreter's teardown."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from dew import compat
from dew.launching.pool import barrier

EXIT_MAX_TIME = 124
"""The status of a run that ``trainer.max_time`` stopped with a checkpoint: GNU ``timeout``'s for a
command that ran out of time. Not 0 (the run is not complete: a script's ``&&`` or a job
dependency on success must not take it for finished), and no requeue: the limit was the user's."""


EXIT_STALLED = 75
"""The status of a process that ``trainer.stall_timeout`` ended and that was not requeued:
``EX_TEMPFAIL`` (sysexits.h), a temporary failure that a retry may get past (dew.training.watchdog)."""


def requeue_after_stall() -> int | None:
    """Requeue the submitit job this process runs in, as a preemption does, from whichever of its
    processes stalled (process 0 may be the one that stopped): the status to exit with, None
    where the job was not requeued (no submitit job, or the requeue failed) or any status will do.
    The local executor's controller starts the job's tasks again once they have all ended, one of
    them with status 144; on SLURM, ``scontrol requeue`` ends every task of the job and queues it
    again (the same job id)."""
    import logging

    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    try:
        status = compat.submitit_requeue()
    except Exception as err:  # scontrol refused or missing: the job ends, not requeued
        logging.getLogger("dew").error("the stalled job could not be requeued: %s: %s", type(err).__name__, err)
        return None
    logging.getLogger("dew").error("requeued the job: it resumes from its last checkpoint")
    return status


def exit_after_stop(signum: int | None, *, reason: str | None = None) -> NoReturn:
    """Exit as the launcher expects once a run stopped on ``signum`` and saved its checkpoint; a
    stop whose ``reason`` is ``max_time`` (``dew.training.preemption.MAX_TIME``) exits with
    ``EXIT_MAX_TIME``, whatever the signal its pool passed it on as.

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

    if reason == "max_time":
        _exit(EXIT_MAX_TIME)
    signum = signum or signal.SIGTERM
    handler = signal.getsignal(signum)
    if os.environ.get("SUBMITIT_EXECUTOR") and (
        signum == compat.submitit_requeue_signal() and callable(handler) and compat.submitit_requeue_handler(handler)
    ):
        try:
            handler(signum, None)
        finally:
            barrier("dew/requeued")
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

    alone = (
        not os.environ.get("SUBMITIT_EXECUTOR")
        and compat.jax_distributed_client() is None
        and HydraConfig.initialized()
        and HydraConfig.get().mode == RunMode.RUN
    )
    if not alone:
        sys.exit(status)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
