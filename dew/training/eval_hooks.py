"""The loop's evaluation hooks: ``Evaluate`` (the held-out data every ``trainer.eval_every`` steps,
the downstream tasks every ``trainer.evals.every``, one report of both) and ``Samples`` (drawn at
each evaluation, for the trackers that take them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from dew.training.hooks import At, Hook
from dew.training.reporting.summary import log_samples

if TYPE_CHECKING:
    from dew.objectives.base import Objective
    from dew.training.evaluate import Evaluator
    from dew.training.reporting.summary import RunReport
    from dew.training.reporting.tracker import Tracker
    from dew.training.step import TrainState
    from dew.training.task_evals import TaskEvaluator


class Evaluate(Hook):
    """Every ``eval_every`` steps (and at the last, unless ``eval_every`` is None: never): the
    evaluation, the hooks that follow it (samples), and its values reported."""

    phase = "eval"

    def __init__(
        self,
        evaluator: Evaluator,
        story: RunReport,
        tracker: Tracker,
        every: int | None,
        tasks: TaskEvaluator | None = None,
        tasks_every: int | None = None,
    ) -> None:
        super().__init__(every)
        self.evaluator, self.story, self.tracker = evaluator, story, tracker
        self.tasks, self.tasks_every = tasks, tasks_every
        """The downstream tasks (``trainer.evals``), scored every ``tasks_every`` steps (and at the last)."""
        self.told: Callable[[int, Mapping[str, float], TrainState], None] = lambda step, values, state: None
        """Tells the hooks of each evaluation (``Hooks.evaluated``)."""
        self.last: dict[str, float] = {}
        """The last evaluation's values (empty before one)."""
        self.step: int | None = None
        """The step of the last evaluation."""

    def due(self, step: int, last: bool) -> bool:
        return self.held_out(step, last) or self.scored(step, last)

    def held_out(self, step: int, last: bool) -> bool:
        """Whether the held-out data is evaluated at ``step``: every ``eval_every`` steps and at the
        last, never with ``trainer.eval_every=null`` (the config's contract: "None to never
        validate"; until 2026-12-07 the last step evaluated it anyway)."""
        return self.every is not None and (last or step % self.every == 0)

    def scored(self, step: int, last: bool) -> bool:
        """Whether the downstream tasks are scored at ``step``: every ``tasks_every`` steps and at the
        last (docs/eval.md)."""
        return self.tasks is not None and (last or every_step(self.tasks_every, step))

    def on_step(self, at: At) -> None:
        values = self.evaluator(at.state.params) if self.held_out(at.step, at.last) else {}
        if self.tasks is not None and self.scored(at.step, at.last):
            values = {**values, **self.tasks(at.state.params)}  # the same evaluation: one event, one report
        self.told(at.step, values, at.state)  # per-evaluation hooks: the samples
        self.story.evaluated(at.step, values)
        self.tracker.metrics(at.step, values)
        self.tracker.event("eval", step=at.step, **values)
        at.evaluation = self.last = values
        self.step = at.step


def every_step(every: int | None, step: int) -> bool:
    return every is not None and step % every == 0


class Samples(Hook):
    """Samples logged to the trackers that take them (W&B, TensorBoard, MLflow) at each evaluation
    (every process: sampling may span all of them), timed as the run report's ``samples`` phase
    inside the evaluation's (the goodput ledger's ``samples``, out of ``eval``)."""

    def __init__(
        self, tracker: Tracker, objective: Objective, seed: int, phase: Callable[[str], AbstractContextManager[object]]
    ) -> None:
        super().__init__(every=None)
        self.tracker, self.objective, self.seed, self.phase_of = tracker, objective, seed, phase

    def on_eval(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        with self.phase_of("samples"):
            log_samples(self.tracker, self.objective, state, step, seed=self.seed)
