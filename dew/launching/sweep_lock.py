"""A sweep whose jobs are alive is not started twice: the launching process holds the sweep's
directory (the run lock, on ``<sweep dir>/.launch/.lock``, removed after) while its jobs run, and the
same command run again meanwhile, or one whose job's run directory is in use, is refused; after a
cancellation, the launcher waits until no job's task holds its run directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from dew.contract.lock import RunLockedError, describe, holder
from dew.training.run_directory import hold

if TYPE_CHECKING:
    from dew.launching.jobs import SweepJob

SWEEP_LOCK_DIR = ".launch"
"""Where in a sweep's directory the launching process holds the run lock while its jobs run (a
hidden directory of its own: a ``.lock`` beside the jobs would make ``dew-runs`` take the sweep
for a run)."""


@contextlib.contextmanager
def holding_the_sweep(sweep_dir: str) -> Iterator[None]:
    """Hold the sweep's lock for the block (``RunLockedError`` if another process holds it), and
    leave no trace of it after: the sweep's directory then holds its jobs alone."""
    lock_dir = os.path.join(sweep_dir, SWEEP_LOCK_DIR)
    held = hold(lock_dir)
    held.__enter__()  # raises, leaving the other process's lock as it is, when one holds it
    try:
        yield
    finally:
        held.__exit__(None, None, None)
        shutil.rmtree(lock_dir, ignore_errors=True)


def refuse_live_jobs(sweep_dir: str, jobs: Sequence[SweepJob]) -> None:
    """Raise ``RunLockedError`` if the sweep is being launched by another live process, or one of
    its jobs' run directories is in use."""
    if (who := holder(os.path.join(sweep_dir, SWEEP_LOCK_DIR))) is not None:
        raise RunLockedError(
            f"the sweep {sweep_dir} is being run by {describe(who)}: its jobs are alive, and "
            "the same command run again would start them twice. Wait for it to end (it "
            "resumes what it did not finish when run again) or stop it"
        )
    refuse_running(jobs)


def refuse_running(jobs: Sequence[SweepJob]) -> None:
    """Raise ``RunLockedError`` if one of the jobs' run directories is in use."""
    for job in jobs:
        if (who := holder(job.run_dir)) is not None:
            raise RunLockedError(
                f"{job.describe()} is running: {job.run_dir} is in use by {describe(who)}; "
                "the same command run again would start it twice. Wait for it to end or stop it"
            )


def wait_until_released(jobs: Sequence[SweepJob], every_s: float = 0.5) -> None:
    """Wait until no process holds any job's run directory: a job the scheduler reports ended
    (cancelled) can still be saving its checkpoint, and only then says where it stopped."""
    while any(holder(job.run_dir) is not None for job in jobs):
        time.sleep(every_s)


def leave_no_trace(sweep_dir: str) -> None:
    """Remove the sweep directory Hydra's sweeper made for its ``multirun.yaml``, if that is all it
    holds (or nothing), and the directories it made for it (those left empty, below the working directory)."""
    if not os.path.isdir(sweep_dir) or set(os.listdir(sweep_dir)) - {"multirun.yaml"}:
        return
    if os.path.exists(record := os.path.join(sweep_dir, "multirun.yaml")):
        os.remove(record)
    os.rmdir(sweep_dir)
    parent = os.path.dirname(os.path.abspath(sweep_dir))
    while parent.startswith(os.getcwd() + os.sep) and not os.listdir(parent):
        os.rmdir(parent)
        parent = os.path.dirname(parent)
