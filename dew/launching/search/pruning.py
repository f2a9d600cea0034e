"""Pruning a search's trials (``hydra/sweeper/pruner=<name>``; docs/search.md, "Pruning").

A trial reports each evaluation's value of the metric it returns (the one choosing its best
checkpoint, ``eval/loss`` unless the objective marks another) at the evaluation's training step, and
asks Optuna's pruner, ``pruner.prune(study, trial)``, whether to go on. When the pruner says stop,
the trial asks its run to stop (``Started.request_stop``): the run ends as early stopping ends it,
its last checkpoint saved, an ``early_stop`` event with the reason ``pruned`` and the ``end`` event
in its journal, and ``dew-train`` returns to the sweeper, which records the trial PRUNED.

Where the pruner's study comes from. The study file (SQLite, its locks off: they fail on NFS and
Lustre) has one writer, the sweeping process, and no trial ever opens it: reading it while that
process writes, with no lock, could read a torn page. A trial's pruner judges instead against a
study held in memory, built at each evaluation from the journals of the sweep's runs
(``<tracking dir>/<sweep>/<number>-.../journal.jsonl``), which every trial's process 0 writes to
the shared filesystem anyway, append-only, one line a record: each run's evaluations are its
intermediate values, its last words its state (``end``: complete, or pruned after a ``pruned``
``early_stop``; a ``stop`` of a failure: failed; anything else: running), and its ``prune_check``
events the pruner's attributes for it (successive halving's rungs). Only process 0 of a trial reads
them and judges; the other processes of a multi-process trial take its verdict
(``dew.launching.pool.from_process_zero``), so every process stops at the same step. The sweeper
replays a trial's journal into the study file when the trial ends (``replay``): the study then holds
the intermediate values, the pruner's attributes and the PRUNED state, as if the trial had reported
to it directly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import optuna
from etils import epath

from dew import compat
from dew.contract import journal as journals
from dew.contract.rundir import FAILURES, JOURNAL, PRUNE_CHECK, PRUNED
from dew.launching.pool import from_process_zero
from dew.training.hooks import Hook, Started
from dew.training.preemption import StopRequest

if TYPE_CHECKING:
    from dew.training.step import TrainState

log = logging.getLogger("dew")

TrialState = optuna.trial.TrialState


@dataclasses.dataclass
class Reported:
    """What one trial reported to the pruner, as its journal says."""

    number: int
    state: TrialState
    values: dict[int, float]
    """Its intermediate values: the metric at each evaluation's step."""
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The pruner's attributes for it (its last ``prune_check`` event's)."""
    pruned_at: int | None = None
    """The step its pruner stopped it at."""


def reported(view: journals.JournalView, number: int, metric: str) -> Reported:
    """Trial ``number``'s report from its run's journal."""
    steps, values = view.series(metric)
    checks = [e for e in view.events if e["event"] == PRUNE_CHECK]
    attrs = dict(checks[-1].get("attrs") or {}) if checks else {}
    last = view.lifecycle()
    state, pruned_at = TrialState.RUNNING, None
    if last is not None and last["event"] == "end":
        early = view.early_stop()
        if early is not None and early.get("reason") == PRUNED:
            state, pruned_at = TrialState.PRUNED, int(early["step"])
        else:
            state = TrialState.COMPLETE
    elif last is not None and last["event"] == "stop" and last.get("reason") in FAILURES:
        state = TrialState.FAIL
    return Reported(number, state, dict(zip(steps, values)), attrs, pruned_at)


def sweep_reports(directory: epath.Path, metric: str) -> dict[int, Reported]:
    """Every trial's report in a sweep's tracking directory (``<number>-<searched values>/`` each),
    by number. A journal that cannot be read (damaged: ``JournalError``) is left out, as a trial
    that reported nothing."""
    out: dict[int, Reported] = {}
    if not directory.is_dir():
        return out
    for job in directory.iterdir():
        number, _, rest = job.name.partition("-")
        if not (number.isdigit() and rest and (job / JOURNAL).exists()):
            continue
        try:
            out[int(number)] = reported(journals.read(job / JOURNAL), int(number), metric)
        except journals.JournalError as err:
            log.warning("pruning: %s is left out: %s", job, err)
    return out


def judge(
    pruner: optuna.pruners.BasePruner,
    study_name: str,
    direction: str,
    others: Mapping[int, Reported],
    own: Reported,
) -> tuple[bool, dict[str, Any]]:
    """Optuna's verdict on trial ``own`` (running, its last value just reported), against a study in
    memory holding ``others`` under their numbers (a number no journal reported is a failed trial,
    which no pruner counts): whether to prune, and the pruner's attributes for the trial after it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" at each evaluation
    study = optuna.create_study(study_name=study_name, direction=optuna.study.StudyDirection[direction.upper()])
    with warnings.catch_warnings():  # create_trial and add_trial: experimental in Optuna 2.10, stable since
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for number in range(max([own.number, *others]) + 1):
            trial = own if number == own.number else others.get(number, Reported(number, TrialState.FAIL, {}))
            study.add_trial(_frozen(trial))
    mine = study.trials[own.number]
    pruned = bool(pruner.prune(study, mine))
    return pruned, dict(study.trials[own.number].system_attrs)


def _frozen(trial: Reported) -> optuna.trial.FrozenTrial:
    """``trial`` as Optuna's record. A complete one's value is its last intermediate value (no
    pruner reads it; Optuna needs one)."""
    value = None
    if trial.state == TrialState.COMPLETE:
        value = trial.values[max(trial.values)] if trial.values else 0.0
    return optuna.trial.create_trial(
        state=trial.state,
        value=value,
        params={},
        distributions={},
        intermediate_values=dict(trial.values),
        system_attrs=dict(trial.attrs),
    )


@dataclasses.dataclass
class Judge:
    """What a trial's pruning needs to know of its search."""

    make_pruner: Callable[[], optuna.pruners.BasePruner]
    study_name: str
    number: int
    """This trial's number (its job number)."""
    sweep_tracking: epath.Path
    """The tracking directory of the sweep's runs (this trial's journal's grandparent)."""
    metric: str
    direction: str
    """minimize or maximize."""


class Prune(Hook):
    """A search's trial's pruning, as a hook of the loop: at each evaluation but the last, process 0
    judges (``judge``), every process takes its verdict, and a pruned trial asks its run to stop.
    The trial's own values and the pruner's attributes travel in its checkpoints (``state``), so a
    resumed trial reports what an uninterrupted one would."""

    state_key = "pruning"

    def __init__(self, judge: Judge, total_steps: int, is_main: bool) -> None:
        super().__init__(every=None)
        self.judge, self.total_steps, self.is_main = judge, total_steps, is_main
        self.pruner = judge.make_pruner()
        self.values: dict[int, float] = {}
        self.attrs: dict[str, Any] = {}
        self.started: Started | None = None

    def start(self, started: Started) -> None:
        self.started = started
        saved = started.saved.get(self.state_key)
        if saved is not None:
            self.values = {int(k): float(v) for k, v in saved["values"].items()}
            self.attrs = dict(saved["attrs"])

    def state(self) -> dict[str, Any]:
        return {"values": {str(k): v for k, v in self.values.items()}, "attrs": self.attrs}

    def on_eval(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        if step >= self.total_steps or self.judge.metric not in values or self.started is None:
            return  # the last evaluation: the trial completes
        value = float(values[self.judge.metric])
        self.values[step] = value
        verdict: list[Any] = [False, self.attrs]
        if self.is_main:
            j = self.judge
            own = Reported(j.number, TrialState.RUNNING, self.values, self.attrs)
            others = {n: r for n, r in sweep_reports(j.sweep_tracking, j.metric).items() if n != j.number}
            verdict = list(judge(self.pruner, j.study_name, j.direction, others, own))
        pruned, self.attrs = from_process_zero(f"prune/{step}", verdict)
        self.started.tracker.event(
            PRUNE_CHECK, step=step, value=value, pruned=pruned, **({"attrs": self.attrs} if self.attrs else {})
        )
        if pruned:
            name = type(self.pruner).__name__.replace("StableHyperband", "HyperbandPruner")
            self.started.request_stop(
                StopRequest(
                    PRUNED,
                    f"{name} at step {step} of {self.total_steps}: {self.judge.metric} {value:.6g}",
                    {"trial": self.judge.number, "pruner": name, "metric": self.judge.metric, "value": value},
                )
            )


def replay(study: optuna.Study, number: int, journal: str, metric: str) -> Reported:
    """Put trial ``number``'s report, read from its run's ``journal``, into ``study`` (the sweeping
    process's, the study file's one writer): its intermediate values (those not there yet) and the
    pruner's attributes. Returns the report (its state says whether the pruner stopped it)."""
    report = reported(journals.read(epath.Path(journal)), number, metric)
    trial = compat.optuna_trial(study, number)
    [frozen] = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    known = frozen.intermediate_values
    for step, value in sorted(report.values.items()):
        if step not in known:
            trial.report(value if math.isfinite(value) else math.nan, step)
    for key, value in report.attrs.items():
        compat.optuna_set_system_attr(study, number, key, value)
    return report
