"""A search's trials on submitit's launchers, each slot refilled the moment its trial ends
(``hydra/launcher=local`` and ``slurm`` under ``hydra/sweeper=optuna``; docs/search.md, "With each
launcher").

Hydra's launcher interface takes a batch of jobs and returns when the last of them has ended, so a
sweeper that launches batches leaves a slot idle from the moment its trial ends (pruned at its first
evaluation, failed, or only shorter) to the end of the batch's longest trial. Here the launcher holds
``slots`` jobs running and asks its ``TrialSource`` (the sweeper) for the next job as soon as one ends,
and hands each ended job's result back at once, so the sampler draws the next trial knowing every
result so far (and the running ones: Optuna's samplers see them in the study).

Every job goes through what a batch's jobs go through: composed as it will compose itself, refused
while another process runs it (exit 4), checked as a single run is (a search's job that fails its
checks is a failed trial, not submitted), started under the launcher's own set-up (the local
launcher's coordinator port per job and its Ctrl-C handling; the SLURM launcher's batch script), and
at the end a job that stopped on a signal ends the command with one line per job, as after a batch.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

from dew.contract.lock import RunLockedError
from dew.launching.checks import failures
from dew.launching.jobs import SweepJob, compose_jobs, stop_record
from dew.launching.sweep_lock import holding_the_sweep, refuse_running, wait_until_released

log = logging.getLogger("dew")

POLL_S = 0.5
"""How often the launching process looks at its running jobs (submitit's ``done()`` reads the job's
state: a file for a local job, ``sacct`` for a SLURM job, which submitit caches and refreshes on its
own schedule)."""


class TrialSource(Protocol):
    """What the sweeper gives the launcher: the next job to start, and where each result goes."""

    def next_job(self) -> tuple[int, Sequence[str]] | None:
        """The next job's number and overrides, or None when no job is to start now (the study has
        all the trials it needs, counting the running ones, or it stops)."""
        ...

    def job_ended(self, number: int, outcome: Any) -> None:
        """Job ``number`` ended: ``outcome`` is Hydra's ``JobReturn`` (its ``return_value`` raises the
        task's own error), or the exception that says why it has none."""
        ...


class CheckFailed(Exception):
    """A job the launcher did not start: it fails dew's checks (the message, one line)."""


class Stopped(Exception):
    """A job that stopped on a signal (Ctrl-C, ``scancel``, a preemption without a requeue)."""


def run_refilled(launcher: Any, source: TrialSource, slots: int) -> None:
    """Run ``source``'s jobs on ``launcher`` (dew's local or SLURM launcher), ``slots`` at a time, each
    slot refilled as its job ends, until the source has no more and none runs. A job that stopped on a
    signal stops the refilling: the command then ends as a batch's launch does (``end_of_stopped``)."""
    from dew.launching.launchers import end_of_stopped

    sweep_dir = str(launcher.config.hydra.sweep.dir)
    try:
        with holding_the_sweep(sweep_dir), launcher.refilling() as signals:
            stopping = _run(launcher, source, max(slots, 1), signals)
    except RunLockedError as err:
        from dew.commandline.exits import EXIT_BUSY

        print(f"dew-train: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BUSY)
    interrupted = signals is not None and signals.received is not None
    if interrupted or stopping is not None:
        stopping = stopping or []
        wait_until_released(stopping)
        end_of_stopped(stopping, interrupted=interrupted, status=signals.status if interrupted else None)


def _run(launcher: Any, source: TrialSource, slots: int, signals: Any) -> list[SweepJob] | None:
    """The refilling loop, until no job runs and none is to start. Returns the jobs that were running
    when it began to stop (a signal to this process, or a job that stopped on one), which the command
    then reports; None when nothing stopped it."""
    executor = launcher.executor()
    running: dict[int, tuple[SweepJob, Any]] = {}
    stopping: list[SweepJob] | None = None
    while True:
        if signals is not None and signals.received is not None and stopping is None:
            stopping = [job for job, _ in running.values()]
        while stopping is None and len(running) < slots and (job := _next(launcher, source)) is not None:
            running[job.num] = (job, launcher.submit(executor, job))
        if not running:
            return stopping
        time.sleep(POLL_S)
        for number, (job, handle) in list(running.items()):
            if handle.done():
                del running[number]
                outcome = _outcome(handle, job)
                if isinstance(outcome, Stopped):
                    stopping = stopping if stopping is not None else [job, *(j for j, _ in running.values())]
                else:
                    source.job_ended(number, outcome)


def _next(launcher: Any, source: TrialSource) -> SweepJob | None:
    """The source's next job, composed and checked; one Hydra cannot compose (an override it cannot
    merge) or that fails dew's checks is handed back failed (``CheckFailed``: the message alone) and
    the next is asked for. Raises ``RunLockedError`` for a job another process
    runs (a trial an earlier command left running, its job still alive)."""
    while (asked := source.next_job()) is not None:
        number, overrides = asked
        [job] = compose_jobs(launcher.config, launcher.hydra_context, [overrides], number)
        refuse_running([job])
        if lines := failures([job], launcher.requested_devices(), launcher.requested_processes()):
            print(f"dew-train: warning: {lines[0]}: the trial fails and the search goes on", file=sys.stderr)
            source.job_ended(number, CheckFailed(lines[0].removeprefix(f"{job.describe()}: ")))
            continue
        return job
    return None


def _outcome(handle: Any, job: SweepJob) -> Any:
    """An ended job's ``JobReturn``; ``Stopped`` for one that stopped on a signal; else the exception
    submitit raises for a job without a result (a process killed outright, a crash)."""
    from submitit.core.utils import UncompletedJobError

    try:
        return handle.results()[0]
    except UncompletedJobError as err:
        wait_until_released([job])  # a cancelled job's tasks may still be saving (SLURM's KillWait)
        record = stop_record(job)
        if record and record.get("event") == "stop" and record.get("reason") in ("preempted", "interrupted"):
            return Stopped(job.describe())
        return err
