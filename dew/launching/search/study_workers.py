"""A study that runs without the command that started it (``hydra.sweeper.workers=N`` with
``hydra/launcher=slurm``; docs/search.md, "Workers: a study no process watches").

The command creates (or continues) the study, checks its space as any search does, submits ``N``
worker jobs (job arrays no larger than the site's ``MaxArraySize``) and returns. Each worker is one
SLURM job that, until the study holds ``n_trials`` trials: asks the study for a trial, trains it in
its own process under its trial number (the run and its job directory exactly as the sweeping
command's trials get them: ``SlurmLaunch.__call__``), and tells the study how it ended. Every worker
reads and writes the one journal (``dew.runs.study_storage``: safe with many writers where ``flock``
fails), so the sampler sees every worker's results and running trials.

- **Exactly ``n_trials``.** Asking is serialised across workers by dew's run lock on
  ``<sweep dir>/.ask`` (flock, or the lease where flock fails): a worker counts the study's trials and
  asks only while there are fewer than ``n_trials``, so no two workers ask for the last one.
- **A worker that dies mid-trial** (killed, its node lost) stops the heartbeat of its trial (the
  file ``<sweep dir>/.workers/<trial number>``, touched every ``grace_s / 4`` seconds). The next
  worker that asks records every running trial whose heartbeat is older than ``grace_s`` as
  FAIL, with why (``fail_reason``), and the others finish the study: a failed trial counts among the
  ``n_trials``, as a trial that diverges does. It is not retried (its parameters are in the study:
  ``dew-runs`` prints them); a preempted worker's SLURM job is requeued, and asks again. A worker
  leaves only once every running trial's worker beats: while one is late, it waits to see the
  heartbeat come back or the grace run out, so the study's last trials are never left running.
- **Running the same command again** submits ``N`` more workers to the same study (raise
  ``n_trials`` to extend it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna

from dew.contract.lock import RunLock, RunLockedError
from dew.launching.launchers import job_process_setup
from dew.launching.search.study_outcome import fail, one_line, overrides_of, record
from dew.runs.study_storage import journal

log = logging.getLogger("dew")

ASK_LOCK_DIR = ".ask"
"""In the sweep directory: the run lock a worker holds while it counts the trials and asks for one."""

HEARTBEATS_DIR = ".workers"
"""In the sweep directory: one file per running trial, touched by its worker while it trains."""


class StudyWorker:
    """One worker job's task (pickled by submitit): train the study's trials until it has enough.
    Its fields are what the sweeping command knew: the launcher that runs one trial in this process,
    the study's storage and settings, the space and Hydra's state."""

    def __init__(
        self,
        launcher: Any,
        *,
        storage_path: str,
        study_name: str,
        sampler: optuna.samplers.BaseSampler,
        space: dict[str, Any],
        fixed: dict[str, Any],
        n_trials: int,
        grace_s: float,
        singleton_state: dict[str, Any],
    ) -> None:
        self.launcher = launcher
        self.storage_path = storage_path
        self.study_name = study_name
        self.sampler = sampler
        self.space = space
        self.fixed = fixed
        self.n_trials = n_trials
        self.grace_s = grace_s
        self.singleton_state = singleton_state

    @property
    def sweep_dir(self) -> str:
        return os.path.dirname(self.storage_path)

    def __call__(self, index: int) -> int:
        """Worker ``index``'s life: trials until the study has ``n_trials``; returns how many it ran."""
        job_process_setup(self.singleton_state)  # dew's resolvers and config store, before any composition
        self.launcher.restore_sweep()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sampler.reseed_rng()  # every worker unpickles the same seed: draw apart
        study = optuna.load_study(study_name=self.study_name, storage=journal(self.storage_path), sampler=self.sampler)
        ran = 0
        while (trial := self._ask(study)) is not None:
            log.info("worker %d: trial %d", index, trial.number)
            with self._heartbeat(trial.number):
                self._run(study, trial)
            ran += 1
        log.info("worker %d: the study has its %d trials; %d ran here", index, self.n_trials, ran)
        return ran

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's requeue (a preempted worker): the worker again, with its index; the trial it
        was training is failed by the next ask once its heartbeat is stale, as a killed worker's."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)

    def _ask(self, study: optuna.Study) -> optuna.trial.Trial | None:
        """A new trial, or None once the study holds ``n_trials`` and every running trial's worker
        beats (counted and asked under the study's ask lock). Running trials whose worker is gone are
        failed first; while one's heartbeat is late (but not yet past the grace), this worker waits to
        see it come back or fail it, so that the study's last trial is never left running."""
        while True:
            with asking(self.sweep_dir):
                fail_stale(study, self.sweep_dir, self.grace_s)
                if len(study.get_trials(deepcopy=False)) < self.n_trials:
                    trial = study.ask(self.space)
                    beat(self.sweep_dir, trial.number)  # before the lock goes: no other worker sees it stale
                    return trial
                if not late(study, self.sweep_dir, self.grace_s / 2):
                    return None
            time.sleep(self.grace_s / 4)

    def _run(self, study: optuna.Study, trial: optuna.trial.Trial) -> None:
        """Train ``trial`` here as the sweeping command's launcher would in a job of its own, and tell
        the study how it ended."""
        overrides = overrides_of(trial.params, self.fixed)
        loader = self.launcher.hydra_context.config_loader
        try:
            loader.load_sweep_config(self.launcher.config, list(overrides))
        except Exception as err:
            fail(study, trial.number, one_line(err))
            return
        try:
            ret = self.launcher(
                list(overrides), "hydra.sweep.dir", trial.number, f"job_id_for_{trial.number}", self.singleton_state
            )
        except Exception as err:  # hydra-submitit-launcher's __call__ returns the task's own errors in ret
            ret = err
        try:
            record(study, trial.number, ret)
        except (
            optuna.exceptions.UpdateFinishedTrialError
        ):  # failed as stale meanwhile (a worker stalled past the grace)
            log.warning("trial %d: recorded failed by another worker before it ended here", trial.number)

    @contextlib.contextmanager
    def _heartbeat(self, number: int) -> Iterator[None]:
        """Touch the trial's heartbeat file while the block runs; remove it after."""
        done = threading.Event()

        def keep_beating() -> None:
            while not done.wait(self.grace_s / 4):
                beat(self.sweep_dir, number)

        thread = threading.Thread(target=keep_beating, name="dew-trial-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            with contextlib.suppress(FileNotFoundError):
                os.remove(heartbeat_path(self.sweep_dir, number))


def heartbeat_path(sweep_dir: str, number: int) -> str:
    return os.path.join(sweep_dir, HEARTBEATS_DIR, str(number))


def beat(sweep_dir: str, number: int) -> None:
    """Trial ``number``'s worker is alive now."""
    path = Path(heartbeat_path(sweep_dir, number))
    path.parent.mkdir(exist_ok=True)
    path.touch()


def heartbeat_age(trial: optuna.trial.FrozenTrial, sweep_dir: str, now: float) -> float:
    """Seconds since trial ``trial``'s worker last beat (a trial with no heartbeat file: since it started)."""
    try:
        return now - os.path.getmtime(heartbeat_path(sweep_dir, trial.number))
    except FileNotFoundError:
        return now - trial.datetime_start.timestamp() if trial.datetime_start is not None else math.inf


def late(study: optuna.Study, sweep_dir: str, after_s: float) -> list[int]:
    """The running trials whose worker has not beaten for ``after_s`` seconds."""
    now = time.time()
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return [t.number for t in running if heartbeat_age(t, sweep_dir, now) > after_s]


def fail_stale(study: optuna.Study, sweep_dir: str, grace_s: float) -> list[int]:
    """Record FAIL every running trial whose worker has not beaten for ``grace_s`` seconds (a trial
    with no heartbeat at all: since it started); the numbers failed."""
    now = time.time()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if (age := heartbeat_age(trial, sweep_dir, now)) > grace_s:
            since = f"{age:.0f} s" if math.isfinite(age) else "ever"
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # another worker was first
                fail(
                    study,
                    trial.number,
                    f"its worker stopped: no heartbeat for {since} (hydra.sweeper.worker_grace_s={grace_s:g}): "
                    "killed, or its node was lost",
                )
            failed.append(trial.number)
            with contextlib.suppress(FileNotFoundError):
                os.remove(heartbeat_path(sweep_dir, trial.number))
    return failed


@contextlib.contextmanager
def asking(sweep_dir: str, every_s: float = 0.2) -> Iterator[None]:
    """Hold the study's ask lock (dew's run lock: flock, or a lease where flock fails) for the block,
    waiting for it while another worker holds it."""
    where = os.path.join(sweep_dir, ASK_LOCK_DIR)
    while True:
        try:
            lock = RunLock(where).acquire()
            break
        except RunLockedError:
            time.sleep(every_s)
    try:
        yield
    finally:
        lock.release()


def array_chunks(count: int, max_array_size: int) -> list[Sequence[int]]:
    """Worker indices ``0..count-1`` in arrays of at most ``max_array_size`` jobs."""
    return [range(i, min(i + max_array_size, count)) for i in range(0, count, max_array_size)]
