"""What every dew launcher (``hydra_plugins/dew_launchers``) does with a sweep's job list: every
job checked before any starts, and a sweep whose jobs are alive refused (``CheckedLaunch``); the
end of a sweep whose jobs stopped on a signal, one line per job (``SubmititLaunch``); and, for the
local executor, Ctrl-C passed on to the jobs and waited for, and tasks that end with a launcher
that was killed."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

SWEEP_LOCK_DIR = ".launch"
"""Where in a sweep's directory the launching process holds the run lock while its jobs run (a
hidden directory of its own: a ``.lock`` beside the jobs would make ``dew-runs`` take the sweep
for a run)."""


class CheckedLaunch:
    """What every dew launcher does with a sweep's job list before it starts any job: refuse a
    sweep whose jobs are alive (exit 4: the same command run again would submit them twice), check
    every job's config as a single run would (exit 2, one line per bad job, nothing submitted),
    then hold the sweep's directory while its jobs run. A mixin before Hydra's launcher class;
    ``requested_devices`` says how many devices a job gets, where the launcher knows it."""

    config: Any
    hydra_context: Any

    def requested_devices(self) -> int | None:
        return None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from dew.cli.sweep_jobs import compose_jobs, failures
        from dew.cli.train import EXIT_BAD_INPUT, EXIT_BUSY
        from dew.training.lock import RunLockedError

        sweep_dir = str(self.config.hydra.sweep.dir)
        jobs = compose_jobs(self.config, self.hydra_context, job_overrides, initial_job_idx)
        try:
            refuse_live_jobs(sweep_dir, jobs)
            if (lines := failures(jobs, self.requested_devices())) and searching(self.config):
                for line in lines:  # a search's trial that fails its checks is a failed trial, not the end
                    print(f"dew-train: warning: {line}: the trial fails and the search goes on", file=sys.stderr)
            elif lines:
                for line in lines:
                    print(f"dew-train: error: {line}", file=sys.stderr)
                print(f"dew-train: nothing was started: {len(lines)} of {len(jobs)} jobs would fail",
                      file=sys.stderr, flush=True)
                _leave_no_trace(sweep_dir)
                sys.exit(EXIT_BAD_INPUT)
            with holding_the_sweep(sweep_dir):
                return self.run_jobs(jobs, job_overrides, initial_job_idx)
        except RunLockedError as err:
            print(f"dew-train: error: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_BUSY)

    def run_jobs(self, jobs: list[Any], job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Start the jobs, as the launcher class after this mixin does, and return their results."""
        return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]


def searching(config: Any) -> bool:
    """Whether the sweep is a search (a sweeper that chooses the next jobs from the last ones'
    values, Optuna's), not Hydra's grid: a job of a grid that fails its checks stops the whole
    sweep before anything starts, but a search's trial that does is reported to the sweeper as
    failed (the job fails its own checks, ``dew.cli.trial``) and the study goes on."""
    from omegaconf import OmegaConf

    target = OmegaConf.select(config, "hydra.sweeper._target_", default="") or ""
    return not target.endswith(".BasicSweeper")


@contextlib.contextmanager
def holding_the_sweep(sweep_dir: str) -> Iterator[None]:
    """Hold the sweep's lock for the block (``RunLockedError`` if another process holds it), and
    leave no trace of it after: the sweep's directory then holds its jobs alone."""
    import shutil

    from dew.training.rundir import hold

    lock_dir = os.path.join(sweep_dir, SWEEP_LOCK_DIR)
    held = hold(lock_dir)
    held.__enter__()  # raises, leaving the other process's lock as it is, when one holds it
    try:
        yield
    finally:
        held.__exit__(None, None, None)
        shutil.rmtree(lock_dir, ignore_errors=True)


def _leave_no_trace(sweep_dir: str) -> None:
    """Remove the sweep directory Hydra's sweeper made for its ``multirun.yaml``, if that is all it
    holds, and the directories it made for it (those left empty, below the working directory)."""
    if not (os.path.isdir(sweep_dir) and os.listdir(sweep_dir) == ["multirun.yaml"]):
        return
    os.remove(os.path.join(sweep_dir, "multirun.yaml"))
    os.rmdir(sweep_dir)
    parent = os.path.dirname(os.path.abspath(sweep_dir))
    while parent.startswith(os.getcwd() + os.sep) and not os.listdir(parent):
        os.rmdir(parent)
        parent = os.path.dirname(parent)


def refuse_live_jobs(sweep_dir: str, jobs: Sequence[Any]) -> None:
    """Raise ``RunLockedError`` if the sweep is being launched by another live process, or one of
    its jobs' run directories is in use."""
    from dew.training.lock import RunLockedError, describe, holder

    if (who := holder(os.path.join(sweep_dir, SWEEP_LOCK_DIR))) is not None:
        raise RunLockedError(f"the sweep {sweep_dir} is being run by {describe(who)}: its jobs are alive, and "
                             "the same command run again would start them twice. Wait for it to end (it "
                             "resumes what it did not finish when run again) or stop it")
    for job in jobs:
        if (who := holder(job.run_dir)) is not None:
            raise RunLockedError(f"{job.describe()} is running: {job.run_dir} is in use by {describe(who)}; "
                                 "the same command run again would start it twice. Wait for it to end or stop it")


class SubmititLaunch(CheckedLaunch):
    """``CheckedLaunch`` for submitit's executors, whose jobs run in other processes: a job that
    stopped on a signal without a requeue (``scancel``, Ctrl-C) ends the command with one line per
    job, where its checkpoint is and the command that resumes it, instead of submitit's
    ``UncompletedJobError``."""

    def run_jobs(self, jobs: list[Any], job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from submitit.core.utils import UncompletedJobError

        try:
            return self.start_and_wait(job_overrides, initial_job_idx)
        except KeyboardInterrupt:
            if not self.interrupted():
                print(f"dew-train: interrupted: the jobs run on ({self.config.hydra.sweep.dir}/.submitit has their "
                      "logs); scancel stops them, and the same command resumes what they did not finish",
                      file=sys.stderr, flush=True)
                sys.exit(130)
            end_of_stopped(jobs, interrupted=True)
        except UncompletedJobError:
            wait_until_released(jobs)  # a cancelled job's tasks may still be saving (SLURM's KillWait)
            if not end_of_stopped(jobs, interrupted=False):
                raise  # a job that failed without stopping: submitit's report is the one to read

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """hydra-submitit-launcher's ``launch``: submit the jobs, wait for them, return their results."""
        return super(CheckedLaunch, self).launch(job_overrides, initial_job_idx)  # type: ignore[misc]

    def interrupted(self) -> bool:
        """Ctrl-C in the launching process: pass it on and wait for the jobs' saves, where the
        launcher can (True); by default (a cluster's queue) the jobs run on."""
        return False


def wait_until_released(jobs: Sequence[Any], every_s: float = 0.5) -> None:
    """Wait until no process holds any job's run directory: a job the scheduler reports ended
    (cancelled) can still be saving its checkpoint, and only then says where it stopped."""
    import time

    from dew.training.lock import holder

    while any(holder(job.run_dir) is not None for job in jobs):
        time.sleep(every_s)


def end_of_stopped(jobs: Sequence[Any], *, interrupted: bool) -> bool:
    """Print one line per job that stopped on a signal (and per job not finished) and exit with a
    stopped run's status; False, printing nothing, when no job stopped so."""
    import shlex

    from dew.cli.sweep_jobs import stop_record
    from dew.training.lock import holder

    stops = {job.num: stop_record(job) for job in jobs}
    if not interrupted and not any(r and r.get("event") == "stop" and r.get("reason") in ("preempted", "interrupted")
                                   for r in stops.values()):
        return False
    command = shlex.join(["dew-train", *sys.argv[1:]])
    for job in jobs:
        record = stops[job.num]
        if record and record.get("event") == "stop":
            step = record["step"]
            print(f"dew-train: {job.describe()}: stopped at step {step}, checkpoint "
                  f"{os.path.join(job.run_dir, str(step))}; resume with: {command}", file=sys.stderr)
        elif holder(job.run_dir) is not None:
            print(f"dew-train: {job.describe()}: still running in {job.run_dir}", file=sys.stderr)
        elif not (record and record.get("event") == "end"):
            print(f"dew-train: {job.describe()}: stopped before its first checkpoint; resume with: {command}",
                  file=sys.stderr)
    sys.stderr.flush()
    reasons = {r.get("reason") for r in stops.values() if r}
    sys.exit(130 if interrupted or "interrupted" in reasons else 143)


def wait_for_controllers(controllers: Sequence[Any]) -> None:
    """After Ctrl-C: the tasks of every local job got it from the terminal (their controllers
    ignore it: ``compat.submitit_local_controllers``); pass it on as SIGTERM, which each controller
    forwards to its tasks (for a launcher interrupted alone; a task already stopping takes no
    notice), and wait until every job has saved and ended. Ctrl-C again only tells the tasks to
    stop at once (the terminal sends it to them); this process waits still."""
    import signal
    import time

    for process in controllers:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    while any(p.poll() is None for p in controllers):
        try:
            time.sleep(0.1)
        except KeyboardInterrupt:
            continue


def watch_launcher(launcher_pid: int, every_s: float = 1.0) -> None:
    """In a local job's task: stop the run (SIGTERM to this process: it saves at the next step
    boundary and ends) once the process that launched it, or the task's controller, is gone, so
    that no task outlives a killed launcher, holding its run's lock."""
    import signal
    import threading
    import time

    controller = os.getppid()

    def alive(pid: int) -> bool:  # a zombie (dead, not yet reaped by its parent) is gone too
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def watch() -> None:
        while os.getppid() == controller and alive(launcher_pid):
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="dew-watch-launcher", daemon=True).start()
