"""dew's Optuna sweeper (``hydra/sweeper=optuna``; docs/search.md): Hydra's sweeper interface over
Optuna's ask-and-tell, with the study a dew sweep needs.

* the study lives in the sweep directory: ``<sweep dir>/study.journal``, Optuna's journal file storage
  (``dew.runs.study_storage``), unless ``storage`` says otherwise, named after the sweep directory, so
  the same command (the same directory: its name is a digest of the command line) continues the
  study. A study an older dew kept in ``study.db`` (optuna 2.10, SQLite) is copied into the journal
  once and continued. This process holds dew's run lock on ``<sweep dir>/.study`` while it sweeps (a
  second command continuing the same study is refused, exit 4);
* ``n_trials`` counts the whole study: a study that holds 2 finished trials and is asked for 4 runs 2;
* a trial left running by an interrupted command runs again first, with its parameters, under its
  own number: job numbers are trial numbers, so it lands in its own job directory and resumes from
  its checkpoint there;
* a failed trial (the task function raised: a run that diverged or was refused) is recorded FAIL and
  the study goes on while the failure rate allows (``max_failure_rate``, 1.0 by default); so is a
  trial that fails before it trains (an override Hydra cannot merge, checked here before the launch,
  or a launch that raises), with its message as the trial's ``fail_reason``: no trial is left running
  but by an interrupt or a refusal that ends the command, and a trial left running resumes through
  the same checks (one an older command could not compose is recorded FAIL then);
* a space that cannot be composed at its low end (``interval(a, b)``, floats, for an int field) is
  refused before any trial;
* every trial's job directory is named by the searched keys (``3-optim.learning_rate=0.0012``);
* a ``pruner`` (``hydra/sweeper/pruner=median``, ...: Optuna's pruners) stops trials at an
  evaluation: each trial judges itself against the sweep's journals (``dew.launching.search.pruning``), and this
  process replays each trial's journal into the study when it ends (its intermediate values, the
  pruner's attributes) and records a pruned one PRUNED.

Optuna is imported here, never by ``dew-train`` itself: this module loads only when the sweeper is
chosen.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import optuna
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

from dew.commandline.configs import conf_dir
from dew.commandline.exits import EXIT_BUSY
from dew.commandline.overrides import unset_record
from dew.contract.lock import RunLock, RunLockedError
from dew.contract.rundir import STUDY_FAIL_REASON, STUDY_FILE, STUDY_LOCK_DIR
from dew.launching.checks import checking
from dew.launching.naming import SWEEP_ENV
from dew.launching.search import search_space
from dew.launching.search.study_outcome import FINISHED, fail, one_line, overrides_of, record
from dew.recipe import Recipe
from dew.runs.study_storage import sweeper_storage

log = logging.getLogger("dew")


@contextlib.contextmanager
def holding_the_study(sweep_dir: str) -> Iterator[None]:
    """The run lock on the study (``STUDY_LOCK_DIR``) for as long as the block sweeps, and no trace
    of it after; a command already sweeping the same study is refused with its host and process
    (exit 4)."""
    where = os.path.join(sweep_dir, STUDY_LOCK_DIR)
    try:
        lock = RunLock(where).acquire()
    except RunLockedError as err:
        print(f"dew-train: error: the study in {sweep_dir}: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BUSY)
    try:
        yield
    finally:
        lock.release()
        shutil.rmtree(where, ignore_errors=True)


class StudySweeper(Sweeper):
    """A search as a Hydra sweeper: Optuna's sampler asks, dew's launchers run the trials, the study in
    the sweep directory keeps the answers (the fields: ``dew.launching.search.sweeper_conf.OptunaSweeperConf``)."""

    config: DictConfig
    hydra_context: HydraContext
    launcher: Any
    sweep_dir: str

    def __init__(
        self,
        sampler: Any,
        direction: Any = "minimize",
        storage: str | None = None,
        study_name: str | None = None,
        n_trials: int = 20,
        n_jobs: int = 2,
        max_failure_rate: float = 1.0,
        params: DictConfig | None = None,
        pruner: Callable[[], optuna.pruners.BasePruner] | None = None,
        refill: bool = True,
        workers: int | None = None,
        worker_grace_s: float = 300.0,
    ) -> None:
        self.sampler = sampler
        """Optuna's sampler as Hydra built it (a ``functools.partial`` of the grid sampler until the space is known)."""
        self.direction = direction
        self.storage = storage
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        if not 0.0 <= max_failure_rate <= 1.0:
            stop(f"hydra.sweeper.max_failure_rate={max_failure_rate} must be between 0 and 1", BAD_INPUT)
        self.max_failure_rate = max_failure_rate
        self.params = params
        self.pruner = pruner
        """``hydra.sweeper.pruner`` as Hydra built it (a ``functools.partial`` of the pruner's class),
        None for no pruning; each trial builds its own (dew.launching.search.pruning)."""
        if workers is not None and workers < 1:
            stop(f"hydra.sweeper.workers={workers} must be >= 1 (or unset: this command runs the study)", BAD_INPUT)
        if worker_grace_s <= 0:
            stop(f"hydra.sweeper.worker_grace_s={worker_grace_s} must be > 0 seconds", BAD_INPUT)
        self.workers = workers
        self.worker_grace_s = worker_grace_s
        self.refill = refill
        """Start each trial as a slot frees (dew's local and SLURM launchers), not in batches."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # dew logs the study's news itself

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )
        self.sweep_dir = str(config.hydra.sweep.dir)

    def sweep(self, arguments: list[str]) -> None:
        self._check_pruner()
        space, fixed = self._search_space(arguments)
        directions = self._directions()
        if len(directions) != 1:
            stop(
                f"hydra.sweeper.direction={directions}: a dew trial returns one number (its selection value); "
                "give one direction, minimize or maximize",
                BAD_INPUT,
            )
        self._check_space(space, fixed)
        self._check_sampler()
        self._record_searched_keys(space)
        if rehearsal(self.config):
            return self._rehearse(space, fixed, directions[0])
        if self.workers is not None:
            return self._submit_workers(space, fixed, directions[0])
        Path(self.sweep_dir).mkdir(parents=True, exist_ok=True)
        with holding_the_study(self.sweep_dir):
            self._sweep(space, fixed, directions[0])

    def _directions(self) -> list[str]:
        """``direction`` as Optuna's names: one, or a list of them."""
        given = list(self.direction) if isinstance(self.direction, (list, tuple, ListConfig)) else [self.direction]
        names = [str(getattr(d, "name", d)).rsplit(".", 1)[-1] for d in given]
        for name in names:
            if name not in ("minimize", "maximize"):
                stop(f"hydra.sweeper.direction={name!r} must be minimize or maximize", BAD_INPUT)
        return names

    def _study(self, direction: str) -> optuna.Study:
        """The study in the sweep directory (``hydra.sweeper.storage``), created or continued."""
        return optuna.create_study(
            study_name=self.study_name or Path(self.sweep_dir).name,
            storage=sweeper_storage(self.sweep_dir, self.storage),
            sampler=self.sampler,
            direction=optuna.study.StudyDirection[direction.upper()],
            load_if_exists=True,
        )

    def _sweep(self, space: dict[str, Any], fixed: dict[str, Any], direction: str) -> None:
        study = self._study(direction)
        log.info(
            "study %s in %s: %d trials so far, %d asked for",
            study.study_name,
            self.sweep_dir,
            len(study.trials),
            self.n_trials,
        )
        if study.trials:  # a seeded sampler would draw the first trials' parameters again
            self.sampler.reseed_rng()
        if self.refill and hasattr(self.launcher, "refilling"):  # dew's local and SLURM launchers
            self._refill(study, space, fixed)
            return self._report(study)
        for trials in _consecutive([t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]):
            log.info("resuming trial(s) %s, left running by an interrupted command", [t.number for t in trials])
            self._run(study, trials, [overrides_of(t.params, fixed) for t in trials])
        while (todo := self.n_trials - sum(t.state in FINISHED for t in study.trials)) > 0:
            trials = [study.ask(space) for _ in range(min(todo, max(self.n_jobs, 1)))]
            for group in _consecutive(trials):
                self._run(study, group, self._configure_trials(group, space, fixed))
        self._report(study)

    def _submit_workers(self, space: dict[str, Any], fixed: dict[str, Any], direction: str) -> None:
        """``hydra.sweeper.workers=N``: the study created (or continued), N worker jobs submitted
        (``dew.launching.search.study_workers``), and the command returns, saying how to follow the study."""
        from hydra.core.singleton import Singleton

        from dew.launching.search.study_workers import StudyWorker

        if not hasattr(self.launcher, "submit_workers"):
            stop(
                f"hydra.sweeper.workers={self.workers} needs hydra/launcher=slurm: workers are jobs that outlive "
                "this command; without it, this command runs the study (hydra.sweeper.n_jobs at a time)",
                BAD_INPUT,
            )
        if (processes := self.launcher.requested_processes()) not in (None, 1):
            stop(
                f"hydra.sweeper.workers={self.workers}: a worker trains its trials in one process, and "
                f"hydra.launcher asks for {processes} (nodes x tasks_per_node): set both to 1",
                BAD_INPUT,
            )
        if problem := self.launcher.launcher_problem():
            stop(problem, BAD_INPUT)
        Path(self.sweep_dir).mkdir(parents=True, exist_ok=True)
        if self.storage is not None:
            stop("hydra.sweeper.workers keeps its study in the sweep directory: leave hydra.sweeper.storage unset")
        with holding_the_study(self.sweep_dir):  # not while a sweeping command holds the study
            study = self._study(direction)
        finished = sum(t.state in FINISHED for t in study.trials)
        worker = StudyWorker(
            self.launcher,
            storage_path=os.path.abspath(os.path.join(self.sweep_dir, STUDY_FILE)),
            study_name=study.study_name,
            sampler=self.sampler,
            space=space,
            fixed=fixed,
            n_trials=self.n_trials,
            grace_s=self.worker_grace_s,
            singleton_state=Singleton.get_state(),
        )
        ids = self.launcher.submit_workers(worker, self.workers)
        print(
            f"dew-train: {len(ids)} workers submitted for study {study.study_name} ({finished} of {self.n_trials} "
            f"trials finished), SLURM jobs {_id_range(ids)}; they run its trials until it has {self.n_trials}.\n"
            f"  follow it:   dew-runs {self.sweep_dir}   and   squeue --me\n"
            "  more workers: the same command again (hydra.sweeper.n_trials=N extends the study)",
            flush=True,
        )

    def _refill(self, study: optuna.Study, space: dict[str, Any], fixed: dict[str, Any]) -> None:
        """Run the study's trials ``n_jobs`` at a time, each slot given the next trial the moment its
        trial ends (``dew.launching.refill``): first the trials an interrupted command left running,
        then new ones until the study has ``n_trials`` finished."""
        from dew.launching.refill import run_refilled

        if problem := self.launcher.launcher_problem():
            stop(problem, BAD_INPUT)
        source = RefilledTrials(self, study, space, fixed)
        run_refilled(self.launcher, source, self.n_jobs)
        if source.stopping is not None:
            stop(source.stopping)

    def _rehearse(self, space: dict[str, Any], fixed: dict[str, Any], direction: str) -> None:
        """``dew-train --check`` or a dry run: the first batch of trials a new study would draw (the
        sampler's seed as configured), drawn in a study held in memory, handed to the launcher,
        which checks (or prints) them and starts nothing; nothing is told, written or continued."""
        study = optuna.create_study(sampler=self.sampler, direction=optuna.study.StudyDirection[direction.upper()])
        trials = [study.ask(space) for _ in range(min(self.n_trials, max(self.n_jobs, 1)))]
        self.launcher.launch(self._configure_trials(trials, space, fixed), initial_job_idx=0)

    def _search_space(self, arguments: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(distributions, fixed values) from ``hydra.sweeper.params`` and the command line (a fixed
        value on the command line takes the key out of the space); the grid sampler gets its grid."""
        given = [f"{k!s}={v}" for k, v in (self.params or {}).items()]
        try:
            space, fixed = search_space.parse([*given, *arguments])
        except ValueError as err:
            stop(f"hydra.sweeper.params: {one_line(err)}", BAD_INPUT)
        if isinstance(self.sampler, functools.partial) and self.sampler.func is optuna.samplers.GridSampler:
            try:
                grid = search_space.grid(space)
            except ValueError as err:
                stop(f"hydra.sweeper.params: {err}", BAD_INPUT)
            self.sampler = self.sampler(grid)
            self.n_trials = min(self.n_trials, math.prod(len(v) for v in grid.values()))
        return space, fixed

    def _check_space(self, space: dict[str, Any], fixed: dict[str, Any]) -> None:
        """Refuse a search space every trial of which would fail in Hydra's composition, before dew
        could say why: one that sets a field of a record this run leaves unset (a warmup with no
        schedule chosen), or whose values cannot be merged into their field at all (the low end of
        ``interval(0, 300)``, a float, into an int field). A space that merges at its low end may
        still hold values dew refuses: those trials fail one by one."""
        if not space:
            stop(
                "hydra.sweeper.params is empty and the command line sweeps nothing: give the space to search, "
                "e.g. optim.learning_rate='tag(log, interval(1e-4, 1e-2))' (docs/search.md)",
                BAD_INPUT,
            )
        for key in space:
            if problem := unset_record(key, self.config, Recipe, conf_dir()):
                stop(f"hydra.sweeper.params: {problem}", BAD_INPUT)
        if problem := self._composition_problem(overrides_of(search_space.lows(space), fixed)):
            floats = [k for k, d in space.items() if f"{k}=" in problem and search_space.is_float(d)]
            stop(
                f"hydra.sweeper.params: {problem}"
                + (
                    f"; {floats[0]} is searched as floats (interval(a, b) samples floats, even between integer "
                    "bounds): an int field needs int(interval(a, b)), range(a, b) or choice(...) (docs/search.md)"
                    if floats
                    else ""
                ),
                BAD_INPUT,
            )

    def _check_sampler(self) -> None:
        """Refuse a sampler that cannot run here before any trial: Optuna imports what some need
        (PyTorch for ``gp``, ``cmaes`` for ``cmaes``) only when they first sample."""
        needs = {optuna.samplers.GPSampler: ("torch", "torch"), optuna.samplers.CmaEsSampler: ("cmaes", "dew[search]")}
        for kind, (module, package) in needs.items():
            if isinstance(self.sampler, kind) and importlib.util.find_spec(module) is None:
                stop(
                    f"hydra/sweeper/sampler: Optuna's {kind.__name__} needs the {module} package, which is not "
                    f"installed: pip install '{package}'",
                    BAD_INPUT,
                )

    def _check_pruner(self) -> None:
        """Refuse a pruner Optuna refuses (``percentile=150``), or one that could never prune: the
        trials report their evaluations, so a run that never evaluates reports nothing."""
        if self.pruner is None:
            return
        try:
            self.pruner()
        except (ValueError, TypeError) as err:
            stop(f"hydra.sweeper.pruner: {one_line(err)}", BAD_INPUT)
        if OmegaConf.select(self.config, "trainer.eval_every") is None:
            stop(
                "hydra.sweeper.pruner is set but trainer.eval_every=null: a trial reports its evaluations to the "
                "pruner; evaluate (trainer.eval_every=N) or drop the pruner",
                BAD_INPUT,
            )

    def _configure_trials(
        self, trials: Sequence[optuna.trial.Trial], space: dict[str, Any], fixed: dict[str, Any]
    ) -> list[tuple[str, ...]]:
        """Each trial's overrides: the parameters the sampler drew for it from ``space`` when it was
        asked (``study.ask(space)``), then the fixed values."""
        return [overrides_of(trial.params, fixed) for trial in trials]

    def _record_searched_keys(self, space: dict[str, Any]) -> None:
        """Name job directories by the searched keys: the sweep record (``dew.launching.naming.SWEEP_ENV``)
        the sweep directory's name wrote lists the command line's sweeps, not the search space."""
        record = json.loads(os.environ.get(SWEEP_ENV) or '{"dir": null, "swept": []}')
        record["swept"] = sorted({*record["swept"], *space})
        os.environ[SWEEP_ENV] = json.dumps(record)

    def _run(self, study: optuna.Study, trials: Sequence[Any], overrides: Sequence[Sequence[str]]) -> None:
        """Run ``trials`` and tell the study each one's value, or that it failed: a trial whose job
        Hydra cannot compose (an override it cannot merge) fails here, with Hydra's message; the
        others launch in runs of consecutive numbers (job numbers are trial numbers)."""
        by_number = dict(zip((t.number for t in trials), overrides))
        failures, ready = [], []
        for trial in trials:
            if (problem := self._composition_problem(by_number[trial.number])) is None:
                ready.append(trial)
            else:
                failures.append(fail(study, trial.number, problem))
        for group in _consecutive(ready):
            failures += self._launch(study, group, [by_number[t.number] for t in group])
        if failures and len(failures) / len(trials) > self.max_failure_rate:
            stop(
                f"{len(failures)} of {len(trials)} trials failed, more than hydra.sweeper.max_failure_rate="
                f"{self.max_failure_rate}; the study stops (the first: {failures[0]})"
            )

    def _composition_problem(self, overrides: Sequence[str]) -> str | None:
        """Why Hydra cannot compose the job of these overrides (as the launcher will compose it), or
        None: ``optim.schedule.warmup_steps=214.5`` into an int field, say."""
        try:
            self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        except Exception as err:
            return one_line(err)
        return None

    def _launch(self, study: optuna.Study, trials: Sequence[Any], overrides: Sequence[Sequence[str]]) -> list[str]:
        """Launch ``trials`` (consecutive numbers), tell the study each one's value or failure, and
        return the failures' messages. A launch that raises fails every trial it held: none is left
        ``running`` (an interrupt or a refusal, which end the command, do leave them so, to resume)."""
        try:
            returns = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
        except Exception as err:
            return [fail(study, t.number, f"its launch failed: {one_line(err)}") for t in trials]
        failures = [failure for trial, ret in zip(trials, returns) if (failure := record(study, trial.number, ret))]
        return failures

    def _report(self, study: optuna.Study) -> None:
        """Log the best trial and write it to ``optimization_results.yaml`` in the sweep directory,
        as the plugin does; a study with no completed trial is an error, and so is one whose trials
        mostly failed (more than half of its finished ones), once its best is written: a search
        whose runs are refused before they train (a warmup longer than the searched length, say)
        does not end as if it searched."""
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
        first = (
            f" (the first, trial {failed[0].number}: {failed[0].user_attrs.get(STUDY_FAIL_REASON, '?')})"
            if failed
            else ""
        )
        if not done:
            stop(f"no trial of study {study.study_name} completed{first}; dew-runs {self.sweep_dir} says why")
        best = study.best_trial
        log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        OmegaConf.save(
            OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
            Path(self.sweep_dir) / "optimization_results.yaml",
        )
        finished = sum(t.state in FINISHED for t in study.trials)
        if 2 * len(failed) > finished:
            stop(
                f"{len(failed)} of the study's {finished} finished trials failed{first}; the best of those that "
                f"completed is trial {best.number} ({best.value}); dew-runs {self.sweep_dir} says why each failed"
            )


class RefilledTrials:
    """The study as a launcher's ``TrialSource`` (``dew.launching.refill``): the next trial to start
    (one an interrupted command left running first, then one the sampler draws, while the study lacks
    finished trials that the running ones would not make up), and each ended trial told to the study
    at once. ``max_failure_rate`` is the share of the trials this command ended that may fail (judged
    once ``n_jobs`` of them ended): past it, no trial starts, the running ones end, and the command
    ends with ``stopping``."""

    def __init__(self, sweeper: StudySweeper, study: optuna.Study, space: dict[str, Any], fixed: dict[str, Any]):
        self.sweeper, self.study, self.space, self.fixed = sweeper, study, space, fixed
        self.resumed = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
        if self.resumed:
            log.info("resuming trial(s) %s, left running by an interrupted command", [t.number for t in self.resumed])
        self.running: set[int] = set()
        self.ended: list[str | None] = []
        """Each trial this command ended: its failure, or None."""
        self.stopping: str | None = None

    def next_job(self) -> tuple[int, tuple[str, ...]] | None:
        if self.stopping is not None:
            return None
        if self.resumed:
            trial: Any = self.resumed.pop(0)
        elif self._lacking() > 0:
            trial = self.study.ask(self.space)
        else:
            return None
        self.running.add(trial.number)  # composed and checked by the launcher (dew.launching.refill)
        return trial.number, overrides_of(trial.params, self.fixed)

    def job_ended(self, number: int, outcome: Any) -> None:
        self.running.discard(number)
        self._ended(record(self.study, number, outcome))

    def _lacking(self) -> int:
        """Finished trials the study lacks, less the ones running."""
        finished = sum(t.state in FINISHED for t in self.study.get_trials(deepcopy=False))
        return self.sweeper.n_trials - finished - len(self.running)

    def _ended(self, failure: str | None) -> None:
        self.ended.append(failure)
        failed = [f for f in self.ended if f is not None]
        rate = self.sweeper.max_failure_rate
        if failed and len(self.ended) >= self.sweeper.n_jobs and len(failed) / len(self.ended) > rate:
            self.stopping = (
                f"{len(failed)} of {len(self.ended)} trials failed, more than hydra.sweeper.max_failure_rate={rate}; "
                f"the study stops (the first: {failed[0]})"
            )


def _id_range(ids: Sequence[str]) -> str:
    """SLURM job ids as one reads them: ``4_[0-7]`` for an array, else the ids."""
    arrays = {i.split("_", 1)[0] for i in ids}
    if len(arrays) == 1 and all("_" in i for i in ids):
        return f"{next(iter(arrays))}_[0-{len(ids) - 1}]"
    return " ".join(ids)


def rehearsal(config: DictConfig) -> bool:
    """Whether this command only checks (``dew-train --check``) or prints what it would submit (a
    launcher's ``dry_run``): a study then draws its first batch of trials and stops."""
    return checking() or bool(OmegaConf.select(config, "hydra.launcher.dry_run", default=False))


def stop(message: str, status: int = 1) -> NoReturn:
    """End the sweep with one line and exit ``status``: 1 when trials failed (their own errors are
    in the log above), 2 (``BAD_INPUT``) when the sweeper's own settings are wrong and nothing ran."""
    print(f"dew-train: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


BAD_INPUT = 2
"""``dew.commandline.exits.EXIT_BAD_INPUT``: a setting is wrong, nothing was started or written."""


def _consecutive(trials: Sequence[Any]) -> Iterator[list[Any]]:
    """``trials`` in runs of consecutive numbers (one launch each: a launch numbers its jobs in a row)."""
    group: list[Any] = []
    for trial in sorted(trials, key=lambda t: t.number):
        if group and trial.number != group[-1].number + 1:
            yield group
            group = []
        group.append(trial)
    if group:
        yield group
