"""Downstream tasks a causal language model is scored on (``trainer.evals``, docs/eval.md): each a
local JSON Lines file of examples, scored as lm-evaluation-harness 0.4.13 scores its
``multiple_choice`` and ``loglikelihood`` tasks, during training every ``every`` steps and by
``dew-eval``. The values each task reports (``eval/<task>/acc``...) are known from the config alone,
so that the best checkpoint and early stopping can watch one before anything is read or compiled.

This module imports nothing heavy (no JAX).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Literal

TaskKind = Literal["multiple_choice", "loglikelihood"]

TASK_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""What a task's name may hold: it is a part of the keys it reports (``eval/<name>/acc``)."""

VALUES: dict[str, dict[str, bool]] = {
    "multiple_choice": {"acc": True, "acc_norm": True},
    "loglikelihood": {"acc": True, "loglikelihood": True, "perplexity": False},
}
"""Each kind's reported values, and whether higher is better: ``acc`` the share of examples whose
most likely choice is the gold one, ``acc_norm`` the same with each choice's log-likelihood divided
by its length in characters; for a ``loglikelihood`` task ``acc`` the share whose continuation is the
greedy one, ``loglikelihood`` the mean of the examples' summed log-likelihoods (nats) and
``perplexity`` exp of its negative (lm-evaluation-harness's ``perplexity`` aggregate)."""


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """One task: a JSON Lines file, one example (a JSON object) a line. A ``multiple_choice``
    example holds a context, its choices and the gold one; a ``loglikelihood`` example a context and
    a continuation. The field names are the task's to choose (HellaSwag's ``ctx``, ``endings``,
    ``label``...)."""

    name: str
    """The task's name in the values it reports: ``eval/<name>/acc``. Letters, digits, ``_``, ``-``, ``.``."""
    path: str
    """The JSON Lines file. A local path is recorded absolute."""
    kind: TaskKind = "multiple_choice"
    """``multiple_choice``: each choice scored by the summed log-likelihood of its tokens after the
    context (``acc``, ``acc_norm``); ``loglikelihood``: the continuation's (``acc``: greedy,
    ``loglikelihood``, ``perplexity``)."""
    context_field: str = "context"
    """The example's field holding the context: a string (may be empty)."""
    choices_field: str = "choices"
    """A ``multiple_choice`` example's field holding its choices: a list of non-empty strings."""
    gold_field: str = "gold"
    """A ``multiple_choice`` example's field holding the right choice: its index (0-based), or its text."""
    continuation_field: str = "continuation"
    """A ``loglikelihood`` example's field holding the continuation, scored as written (put its
    leading space in the file, as lm-evaluation-harness's loglikelihood tasks do)."""
    target_delimiter: str = " "
    """Put between the context and each choice of a ``multiple_choice`` task (lm-evaluation-harness's
    ``target_delimiter``, whose default is a space)."""
    limit: int | None = None
    """Score only the first this many examples; unset scores them all."""

    def __post_init__(self) -> None:
        if not TASK_NAME.fullmatch(self.name):
            raise ValueError(
                f"trainer.evals.tasks: name={self.name!r} must be letters, digits, '_', '-' or '.' "
                "(it names the values the task reports: eval/<name>/acc)"
            )
        if self.kind not in VALUES:
            raise ValueError(f"trainer.evals.tasks[{self.name}].kind={self.kind!r} must be one of {sorted(VALUES)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"trainer.evals.tasks[{self.name}].limit={self.limit} must be >= 1 example (or null)")
        if self.path and "://" not in self.path:
            object.__setattr__(self, "path", os.path.abspath(os.path.expanduser(self.path)))

    def values(self) -> dict[str, bool]:
        """The keys this task reports (``eval/<name>/<value>``), each with whether higher is better."""
        return {f"eval/{self.name}/{v}": higher for v, higher in VALUES[self.kind].items()}


@dataclasses.dataclass(frozen=True)
class Evals:
    """Downstream tasks scored during training (docs/eval.md, "During training"): every ``every``
    steps and at the last, beside the held-out evaluation, their values reported as
    ``eval/<task>/<value>`` to the journal and every tracker."""

    tasks: tuple[EvalTask, ...] = ()
    """The tasks (none where only ``best`` is set), e.g. ``[{name: hellaswag, path: hs.jsonl,
    context_field: ctx, choices_field: endings, gold_field: label}]``."""
    every: int | None = None
    """Steps between two scorings of the tasks; unset scores them at each held-out evaluation
    (``trainer.eval_every``). Either way also at the run's last step."""
    batch_size: int = 32
    """Rows (one per context and choice) scored at once, on every process together; each length
    bucket compiles once for this many rows."""
    best: str | None = None
    """The evaluation value that chooses the best checkpoint instead of ``eval/loss``: any the run's
    evaluations report, a task's (``eval/<task>/acc_norm``; higher is better but for ``perplexity``), a
    held-out source's (a mixture's ``eval/<source>/loss``; a metric's own direction, lower for the
    rest) or ``eval/loss``; one the run does not report is refused before its first step. With no
    tasks, it alone is set. Unset: ``eval/loss`` (or the metric marked best) as without tasks."""

    def __post_init__(self) -> None:
        if not self.tasks and self.best is None:
            raise ValueError(
                "trainer.evals.tasks is empty: name at least one task or trainer.evals.best (or unset trainer.evals)"
            )
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"trainer.evals.tasks: names {names} repeat; each task reports under its own name")
        if self.every is not None and self.every < 1:
            raise ValueError(f"trainer.evals.every={self.every} must be >= 1 step (or null: at each evaluation)")
        if self.batch_size < 1:
            raise ValueError(f"trainer.evals.batch_size={self.batch_size} must be >= 1 row")
        if self.best is not None and not self.best.startswith("eval/"):
            raise ValueError(
                f"trainer.evals.best={self.best!r} must be an evaluation value: a task's (eval/<task>/acc_norm), "
                "a held-out source's (eval/<source>/loss) or eval/loss"
            )
        task = next((t for t in self.tasks if self.best is not None and self.best.startswith(f"eval/{t.name}/")), None)
        if task is not None and self.best not in task.values():
            raise ValueError(
                f"trainer.evals.best={self.best!r} is not a value task {task.name!r} reports: "
                f"{', '.join(task.values())}"
            )

    def values(self) -> dict[str, bool]:
        """Every key the tasks report, each with whether higher is better."""
        return {k: v for t in self.tasks for k, v in t.values().items()}
