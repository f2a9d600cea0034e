"""Early stopping (``trainer.early_stopping``): a hook of the loop that watches one evaluation value
and asks the run to stop (``dew.training.preemption.StopRequest``) once it has not improved for
``patience`` evaluations in a row.

The rule, at each evaluation: the value improves on the best so far when it is finite and better by
more than ``min_delta`` (lower, or higher for a metric whose higher values are better); an
improvement makes it the best and sets the count of evaluations without one to 0, anything else
(a non-finite value too) adds 1. Once the count reaches ``patience`` at an evaluation past the first
``warmup`` ones, the run stops after that step, with its last checkpoint there.

The count, the best value and its step travel in every checkpoint (``Hook.state``), not in the
journal: a resume restores them as they were at the step it resumes from, whichever checkpoint that
is (one before a damaged one too), on every process, while the journal is written by process 0
alone, may live elsewhere and holds evaluations a killed process made past that step. A preempted
run therefore stops at the step an uninterrupted one does.

A ``metric`` the run's evaluations do not report is refused before the run writes anything
(``check``, among the set-up's checks and a launcher's), from what the objective declares its
evaluation reports; the hook refuses it again at the first evaluation, for an objective that
declares nothing and a dataset without evaluation batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew.training.evaluate import NotReported, check_named, higher_is_better, produced
from dew.training.evaluate import not_reported as named_not_reported
from dew.training.hooks import Hook, Started
from dew.training.preemption import StopRequest

if TYPE_CHECKING:
    from dew.contract.config import EarlyStopping
    from dew.contract.evals import Evals
    from dew.objectives.base import Metric, Objective
    from dew.training.state import TrainState

REASON = "early_stopping"
"""The ``reason`` of the journal's ``early_stop`` event when this rule stopped the run."""


class EarlyStoppingMetricError(NotReported):
    """``trainer.early_stopping.metric`` names a value the run's evaluations do not report."""


def not_reported(metric: str, values: Sequence[str]) -> NotReported:
    """The error for a watched ``metric`` outside the ``values`` the evaluations report."""
    return named_not_reported("trainer.early_stopping.metric", metric, values, EarlyStoppingMetricError)


def check(
    rule: EarlyStopping | None,
    objective: Objective,
    metrics: Sequence[Metric],
    sources: Sequence[str] = (),
    *,
    evals: Evals | None = None,
) -> None:
    """Refuse, before the run writes or trains anything, a ``rule.metric`` that the run's evaluations
    do not report (``dew.training.evaluate.produced``: the objective's own declaration, each value also
    per held-out source of the data, ``eval/<source>/loss``, and the downstream tasks' of ``evals``),
    by the rule ``trainer.evals.best`` is checked by. An objective that declares nothing is left to
    the hook's check at the first evaluation, as is a dataset without evaluation batches."""
    if rule is None or rule.metric is None:
        return  # the best checkpoint's metric, checked as trainer.evals.best
    values = produced(objective, metrics, sources, evals)
    check_named("trainer.early_stopping.metric", rule.metric, values, EarlyStoppingMetricError)


def watched(
    rule: EarlyStopping, metrics: Sequence[Metric], best: tuple[str, bool], evals: Evals | None = None
) -> tuple[str, bool]:
    """The evaluation value the rule watches and whether higher is better: ``rule.metric`` or the
    best checkpoint's metric ``best`` (a key and its direction), in ``rule.mode`` or the metric's own
    direction (``dew.training.evaluate.higher_is_better``: a downstream task's value's from
    ``evals``, a metric's, per held-out source too)."""
    name = rule.metric or best[0]
    higher = best[1] if name == best[0] else higher_is_better(name, metrics, evals)
    return name, (rule.mode == "max") if rule.mode is not None else higher


class EarlyStop(Hook):
    """The rule as a hook: it reads each evaluation (``on_eval``) and asks the run to stop."""

    state_key = "early_stopping"

    def __init__(
        self, rule: EarlyStopping, metric: str, higher_is_better: bool, tasks: Mapping[str, bool] | None = None
    ) -> None:
        super().__init__(every=None)
        self.rule, self.metric, self.higher_is_better = rule, metric, higher_is_better
        self.tasks = frozenset(tasks or ())
        """The downstream tasks' values (``trainer.evals``): scored at their own cadence, so an
        evaluation may hold them alone, or lack them."""
        self.best: float | None = None
        """The best value so far (None before a finite one)."""
        self.best_step: int | None = None
        self.waited = 0
        """Evaluations in a row since the best one (or since the start) that did not improve on it."""
        self.evaluations = 0
        """Evaluations seen, the warmup's included."""
        self.request_stop: Callable[[StopRequest], None] | None = None

    def start(self, started: Started) -> None:
        self.request_stop = started.request_stop
        saved = started.saved.get(self.state_key)
        if saved is not None:  # a resumed run: the count as it stood at the checkpoint's step
            self.best, self.best_step = saved["best"], saved["best_step"]
            self.waited, self.evaluations = saved["waited"], saved["evaluations"]

    def state(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "best": self.best,
            "best_step": self.best_step,
            "waited": self.waited,
            "evaluations": self.evaluations,
        }

    def on_eval(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        request = self.observe(step, values)
        if request is not None and self.request_stop is not None:
            self.request_stop(request)

    def observe(self, step: int, values: Mapping[str, float]) -> StopRequest | None:
        """Count the evaluation at ``step``; the stop request when the rule says to stop there."""
        if self.metric not in values and not self.other_cadence(values):
            raise not_reported(self.metric, list(values))  # checked before the run where the objective declares them
        if self.metric not in values:
            return None  # an evaluation of the other cadence: not counted
        value = float(values[self.metric])
        self.evaluations += 1
        if self.improves(value):
            self.best, self.best_step, self.waited = value, step, 0
        else:
            self.waited += 1
        if self.evaluations <= self.rule.warmup or self.waited < self.rule.patience:
            return None
        best = f"{self.best:.6g} at step {self.best_step}" if self.best is not None else "no finite value"
        return StopRequest(
            REASON,
            f"{self.metric} did not improve by more than {self.rule.min_delta:g} for {self.waited} evaluations "
            f"(patience {self.rule.patience}); best {best}",
            {"metric": self.metric, "best": self.best, "best_step": self.best_step, "waited": self.waited},
        )

    def other_cadence(self, values: Mapping[str, float]) -> bool:
        """Whether ``values`` come from an evaluation at the other cadence than the watched value's:
        the tasks' alone for a held-out value, or none of the tasks' for a task's value."""
        if not self.tasks:
            return False
        scored = self.tasks & set(values)
        return not scored if self.metric in self.tasks else bool(values) and scored == set(values)

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if self.higher_is_better else self.best - value
        return gain > self.rule.min_delta
