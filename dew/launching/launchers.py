"""What every dew launcher (``hydra_plugins/dew_launchers``) does with a sweep's job list: every
job checked before any starts, and a sweep whose jobs are alive refused (``CheckedLaunch``); the
end of a sweep whose jobs stopped on a signal, one line per job (``SubmititLaunch``); and what a
submitit job needs in its own process (``job_process_setup``). The Hydra launcher classes are these
mixins before Hydra's and hydra-submitit-launcher's classes; ``dew.launching.local_launcher`` and
``dew.launching.slurm_launcher`` hold what each submitit launcher adds."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from hydra.core.singleton import Singleton
from omegaconf import DictConfig, OmegaConf

from dew import compat
from dew.commandline.configs import register_configs
from dew.commandline.exits import EXIT_BAD_INPUT, EXIT_BUSY
from dew.contract.lock import RunLockedError, holder
from dew.launching.checks import checking, failures, record_checked
from dew.launching.gc_settings import collect_less
from dew.launching.grid_report import best_run_line
from dew.launching.interrupts import LaunchInterrupts, current, stop_before_start
from dew.launching.jobs import SweepJob, compose_jobs, stop_record
from dew.launching.search.sweeper_conf import store_sweeper_config
from dew.launching.sweep_lock import holding_the_sweep, leave_no_trace, refuse_live_jobs, wait_until_released
from dew.training.preemption import install_early

log = logging.getLogger("dew")


class CheckedLaunch:
    """What every dew launcher does with a sweep's job list before it starts any job: refuse a
    sweep whose jobs are alive (exit 4: the same command run again would submit them twice), check
    every job's config as a single run would (exit 2, one line per bad job, nothing submitted),
    then hold the sweep's directory while its jobs run. A mixin before Hydra's launcher class;
    ``requested_devices`` says how many devices a job gets, where the launcher knows it."""

    config: Any
    hydra_context: Any
    params: dict[str, Any]
    started = 0.0
    """When this launch started its jobs (``time.time()``)."""
    dry_run = False
    """A launch that only prints what it would submit (the SLURM launcher's ``dry_run``): checked
    like any other, and leaving nothing behind, not even Hydra's ``multirun.yaml``."""

    def requested_devices(self) -> int | None:
        return None

    def requested_processes(self) -> int | None:
        """How many processes (tasks) each job starts, where the launcher's parameters say."""
        return None

    def launcher_problem(self) -> str | None:
        """What stops this launcher from starting any job on this machine (no ``sbatch`` here),
        as one sentence; None when it can."""
        return None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        sweep_dir = str(self.config.hydra.sweep.dir)
        _stop_if_interrupted(sweep_dir)  # Ctrl-C while Hydra composed: nothing is started
        jobs = compose_jobs(self.config, self.hydra_context, job_overrides, initial_job_idx)
        try:
            refuse_live_jobs(sweep_dir, jobs)
            lines = failures(jobs, self.requested_devices(), self.requested_processes())
            problem = self.launcher_problem()
            if lines and searching(self.config) and not checking() and not problem:
                for line in lines:  # a search's trial that fails its checks is a failed trial, not the end
                    print(f"dew-train: warning: {line}: the trial fails and the search goes on", file=sys.stderr)
            elif lines or problem:
                for line in [*lines, *([problem] if problem else [])]:
                    print(f"dew-train: error: {line}", file=sys.stderr)
                if lines:
                    print(
                        f"dew-train: nothing was started: {len(lines)} of {len(jobs)} jobs would fail",
                        file=sys.stderr,
                        flush=True,
                    )
                leave_no_trace(sweep_dir)
                sys.exit(EXIT_BAD_INPUT)
            if checking():  # dew-train --check: checked, and nothing started
                record_checked(len(jobs))
                leave_no_trace(sweep_dir)
                return []
            _stop_if_interrupted(sweep_dir, len(jobs))
            self.started = time.time()  # the job folders this launch makes are younger
            with holding_the_sweep(sweep_dir):
                results = self.run_jobs(jobs, job_overrides, initial_job_idx)
            if self.dry_run:
                leave_no_trace(sweep_dir)
            elif not searching(self.config) and (best := best_run_line(results, sweep_dir)):
                print(f"dew-train: {best}", file=sys.stderr, flush=True)
            return results
        except RunLockedError as err:
            print(f"dew-train: error: {err}", file=sys.stderr, flush=True)
            sys.exit(EXIT_BUSY)

    def run_jobs(self, jobs: list[Any], job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Start the jobs, as the launcher class after this mixin does, and return their results;
        Ctrl-C is then answered as Python answers it (``dew.launching.interrupts.hand_back``)."""
        hand_back_signals()
        return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]


def _stop_if_interrupted(sweep_dir: str, jobs: int | None = None) -> None:
    """End the command, leaving no trace, if the launching process got Ctrl-C (or SIGTERM) before
    this launch started its jobs."""
    if (signals := current()) is not None and signals.received is not None:
        leave_no_trace(sweep_dir)
        stop_before_start(jobs)


def hand_back_signals() -> None:
    """Python's own SIGINT and SIGTERM handlers again, for a launcher that answers them itself."""
    if (signals := current()) is not None:
        signals.hand_back()


def searching(config: DictConfig) -> bool:
    """Whether the sweep is a search (a sweeper that chooses the next jobs from the last ones'
    values, Optuna's), not Hydra's grid: a job of a grid that fails its checks stops the whole
    sweep before anything starts, but a search's trial that does is reported to the sweeper as
    failed (the job fails its own checks, ``dew.launching.search.trial``) and the study goes on."""
    target = OmegaConf.select(config, "hydra.sweeper._target_", default="") or ""
    return not target.endswith(".BasicSweeper")


class SubmititLaunch(CheckedLaunch):
    """``CheckedLaunch`` for submitit's executors, whose jobs run in other processes: a job that
    stopped on a signal without a requeue (``scancel``, Ctrl-C) ends the command with one line per
    job, where its checkpoint is and the command that resumes it, instead of submitit's
    ``UncompletedJobError``."""

    def run_jobs(self, jobs: list[Any], job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from submitit.core.utils import UncompletedJobError

        hand_back_signals()
        try:
            return self.start_and_wait(job_overrides, initial_job_idx)
        except KeyboardInterrupt:
            self.interrupted()
        except UncompletedJobError:
            if not ended_on_a_signal(jobs):
                end_of_refused(jobs, self.params["submitit_folder"], self.started)
                raise  # a job that failed without stopping or refusing: submitit's report is the one to read

    def start_and_wait(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """hydra-submitit-launcher's ``launch``: submit the jobs, wait for them, return their results."""
        return super(CheckedLaunch, self).launch(job_overrides, initial_job_idx)  # type: ignore[misc]

    # A search's trials one job at a time, each slot refilled as its job ends (dew.launching.refill).

    _EXECUTOR: str
    """hydra-submitit-launcher's name of the submitit executor (``local``, ``slurm``)."""

    @contextlib.contextmanager
    def refilling(self) -> Iterator[LaunchInterrupts | None]:
        """The set-up of a refilled search's whole run (``dew.launching.refill``), around every
        submission: yields the launching process's signal handler, or None where Ctrl-C is Python's
        own (it then ends the command at once, the jobs running on, as after a batch)."""
        hand_back_signals()
        try:
            yield None
        except KeyboardInterrupt:
            self.interrupted()

    def interrupted(self) -> NoReturn:
        """Ctrl-C in a launcher whose jobs outlive it (SLURM's): say where they are, exit 130."""
        print(
            f"dew-train: interrupted: the jobs run on ({self.config.hydra.sweep.dir}/.submitit has their "
            "logs); scancel stops them, and the same command resumes what they did not finish",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(130)

    def executor(self) -> Any:
        """submitit's executor with this launcher's parameters, as hydra-submitit-launcher's ``launch``
        builds it (it builds one inside ``launch`` and keeps none: a job submitted on its own needs
        its own): ``max_num_timeout`` an argument of the executor, the queue's shared fields as they
        are and the others prefixed with the executor's name."""
        import submitit

        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        own = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=self.params["submitit_folder"],
            **{f"{self._EXECUTOR}_max_num_timeout": v for k, v in self.params.items() if k == "max_num_timeout"},
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in self.params.items() if k not in own}
        )
        return executor

    def submit(self, executor: Any, job: SweepJob) -> Any:
        """Submit ``job`` alone (its own submitit job, as each job of a batch's array is), with the
        arguments hydra-submitit-launcher gives every job; its handle."""
        from hydra.core.utils import filter_overrides

        log.info("\t#%d : %s", job.num, " ".join(filter_overrides(job.overrides)))
        return executor.submit(
            self, job.overrides, "hydra.sweep.dir", job.num, f"job_id_for_{job.num}", Singleton.get_state()
        )


def ended_on_a_signal(jobs: Sequence[Any]) -> bool:
    """After submitit reported a job ended without a result: exit as ``end_of_stopped`` does if the
    jobs stopped on a signal (once no task still saves: a cancelled job's tasks may be, SLURM's
    KillWait); False if none did."""
    wait_until_released(jobs)
    return end_of_stopped(jobs, interrupted=False)


REFUSAL = "dew-train: error: "
"""How a task's own refusal begins (``dew.cli.train.fail``, dew-train's): one line, then its exit status."""


def end_of_refused(jobs: Sequence[SweepJob], submitit_folder: str, since: float) -> None:
    """After submitit reported a job ended without a result: if the job's tasks ended with dew's
    own one-line error (a refusal only the job's processes can make, over the devices they see, or
    a run's own stop: a non-finite loss, no intact checkpoint), print each such job's line, as the
    launch's own checks do, with the task log it comes from, and exit 1; return, printing nothing,
    for any other failure (a crash: submitit's report, with its traceback, is the one to read).
    ``since``: when this launch began (older job folders are an earlier launch's)."""
    by_number: dict[int | None, SweepJob] = {job.num: job for job in jobs}
    lines = []
    for submitted in sorted(glob.glob(os.path.join(submitit_folder.replace("%j", "*"), "*_submitted.pkl"))):
        if os.path.getmtime(submitted) < since:
            continue
        for log in sorted(glob.glob(os.path.join(os.path.dirname(submitted), "*_log.*"))):  # rank 0's first
            with open(log, errors="replace") as f:
                refused = [line for line in f.read().splitlines() if line.startswith(REFUSAL)]
            if refused:
                job = by_number.get(compat.submitit_job_number(submitted))
                where = job.describe() if job is not None else f"job {os.path.basename(os.path.dirname(submitted))}"
                lines.append(f"{REFUSAL}{where}: {refused[-1].removeprefix(REFUSAL)} (in {log})")
                break
    if not lines:
        return
    for line in lines:
        print(line, file=sys.stderr)
    print(
        f"dew-train: {len(lines)} of {len(jobs)} jobs ended with the error{'s' * (len(lines) > 1)} above",
        file=sys.stderr,
    )
    sys.stderr.flush()
    sys.exit(1)


def end_of_stopped(jobs: Sequence[SweepJob], *, interrupted: bool, status: int | None = None) -> bool:
    """Print one line per job that stopped on a signal (and per job not finished; after an
    interrupt, per job that ended too) and exit with a stopped run's status (``status``, where the
    launching process knows it); False, printing nothing, when no job stopped so."""
    stops = {job.num: stop_record(job) for job in jobs}
    if not interrupted and not any(
        r and r.get("event") == "stop" and r.get("reason") in ("preempted", "interrupted") for r in stops.values()
    ):
        return False
    command = shlex.join(["dew-train", *sys.argv[1:]])
    for job in jobs:
        record = stops[job.num]
        if record and record.get("event") == "stop":
            step = record["step"]
            print(
                f"dew-train: {job.describe()}: stopped at step {step}, checkpoint "
                f"{os.path.join(job.run_dir, str(step))}; resume with: {command}",
                file=sys.stderr,
            )
        elif holder(job.run_dir) is not None:
            print(f"dew-train: {job.describe()}: still running in {job.run_dir}", file=sys.stderr)
        elif not (record and record.get("event") == "end"):
            print(
                f"dew-train: {job.describe()}: stopped before its first checkpoint; resume with: {command}",
                file=sys.stderr,
            )
        elif interrupted:
            print(
                f"dew-train: {job.describe()}: ended at step {record['step']} before the interrupt reached it, "
                f"in {job.run_dir}",
                file=sys.stderr,
            )
    sys.stderr.flush()
    reasons = {r.get("reason") for r in stops.values() if r}
    sys.exit(status or (130 if interrupted or "interrupted" in reasons else 143))


def job_process_setup(singleton_state: dict[str, Any]) -> None:
    """In a submitit job's own process, before its task runs: dew's stop handlers listen from the
    start (a signal during set-up or restore is the run's, not submitit's: ``dew.training.preemption``)
    and dew's OmegaConf resolvers, which do not travel in the pickle, are registered again. Then
    Hydra's state from the launching process (``singleton_state``, what hydra-submitit-launcher
    restores itself next) is restored here first: restoring it scans Hydra's plugins, and the scan
    stores hydra-optuna-sweeper's config over dew's (the launching process stored dew's after its
    scan: ``hydra_plugins.dew_sweepers``), so dew's goes back after it; the launcher's own restore
    then finds the plugins scanned and leaves the store as it is. (The job composes its config
    again, with ``hydra/sweeper/pruner=...`` when the search prunes.)"""
    install_early()
    collect_less()  # the task's process is dew's: dew.launching.gc_settings
    register_configs()
    Singleton.set_state(singleton_state)
    store_sweeper_config()
