"""Downstream tasks scored on a state's parameters (``trainer.evals``; docs/eval.md): the tasks'
rows (``dew.data.eval_tasks``) through the compiled scoring (``assembly.compile_scorer``), one
program per row length for the whole run, and the values they give (``eval/<task>/acc``...).

The training loop scores them in its evaluation (``dew.training.trainer.Evaluate``) and ``dew-eval``
on a saved step, with the same ``TaskEvaluator``. Every process reads and tokenizes every task (the
same files give the same rows), feeds its own part of each batch's rows and gets every row's score
back, so each computes the values alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh

from dew.contract.config import TrainerConfig
from dew.contract.evals import Evals
from dew.contract.objectives import objectives, summary_name
from dew.data import eval_tasks
from dew.data.eval_tasks import HarnessEncoding, RowBatch, Scored, Task
from dew.data.tokenizer import from_record
from dew.objectives.base import Objective
from dew.objectives.continuations import ROLE
from dew.training import assembly

Score = Callable[[nnx.State, dict[str, jax.Array]], tuple[jax.Array, jax.Array]]


def encoding_of(objective: Objective, field: str = "trainer.evals") -> tuple[HarnessEncoding, int]:
    """The tokenizer the tasks are encoded with (the data's, which the model was trained on) and the
    model's length; an objective whose model is not a causal language model, or data without a
    tokenizer, is refused naming ``field``."""
    name = summary_name(objective)
    if name is None or name not in objectives or objectives[name].role != ROLE:
        raise ValueError(
            f"{field}: the tasks score a causal language model's continuations (objective next_token); "
            f"this run trains objective {name!r}"
        )
    record = getattr(objective, "tokenizer", None)
    if not record:
        raise ValueError(
            f"{field}: the tasks are text, and this run's data has no tokenizer to encode them with "
            "(data given by its vocab_size alone); train on data dew-prepare tokenized"
        )
    seq_len = getattr(objective, "seq_len", None)
    if not isinstance(seq_len, int):
        raise ValueError(f"{field}: objective {name!r} does not say its model's length (seq_len)")
    return HarnessEncoding(from_record(record)), seq_len


def load(evals: Evals, objective: Objective, field: str = "trainer.evals") -> list[Task]:
    """The tasks of ``evals``, read and tokenized for ``objective``'s model; errors name ``field``."""
    encoding, seq_len = encoding_of(objective, field)
    return eval_tasks.load_tasks(evals.tasks, encoding, seq_len, f"{field}.tasks")


def check(t: TrainerConfig, objective: Objective, mesh: Mesh | AbstractMesh, process_count: int | None = None) -> None:
    """Refuse, before the run writes anything, tasks that cannot be scored: read and tokenized here,
    and their batch split over the mesh as an evaluation's."""
    if t.evals is None or not t.evals.tasks:
        return
    load(t.evals, objective)
    assembly.check_batches(
        t, mesh, [(t.evals.batch_size, "trainer.evals.batch_size")], process_count=process_count, accumulation=1
    )


@dataclasses.dataclass
class TaskEvaluator:
    """The tasks scored on parameters: ``evaluator(params)`` is their values by key."""

    tasks: list[Task]
    batches: list[RowBatch]
    """Every task's rows, in batches of fixed shapes (``eval_tasks.row_batches``)."""
    score: Score
    """The compiled scoring of one batch of rows (``assembly.compile_scorer``)."""
    place: Callable[[Mapping[str, np.ndarray]], dict[str, jax.Array]]
    """This process's rows of a batch, placed on the mesh."""

    def scores(self, params: nnx.State) -> tuple[np.ndarray, np.ndarray]:
        """Every request's summed log-likelihood and greedy flag, in the tasks' order."""
        n = sum(len(t.requests()) for t in self.tasks)
        out = []
        for b in self.batches:  # dispatched one after another; fetched once, at the end
            out.append(self.score(params, self.place({"inputs": b.inputs, "targets": b.targets, "mask": b.mask})))
        lls, greedy = np.zeros(n, np.float64), np.zeros(n, bool)
        for b, (ll, g) in zip(self.batches, jax.device_get(out), strict=True):
            real = b.request >= 0
            lls[b.request[real]], greedy[b.request[real]] = np.asarray(ll)[real], np.asarray(g)[real]
        return lls, greedy

    def examples(self, params: nnx.State) -> dict[str, list[Scored]]:
        """Each task's examples scored, by task name."""
        lls, greedy = self.scores(params)
        out, at = {}, 0
        for t in self.tasks:
            n = len(t.requests())
            out[t.spec.name] = eval_tasks.score_examples(t, lls[at : at + n], greedy[at : at + n])
            at += n
        return out

    def values(self, scored: Mapping[str, Sequence[Scored]]) -> dict[str, float]:
        return {k: v for t in self.tasks for k, v in eval_tasks.task_values(t, scored[t.spec.name]).items()}

    def __call__(self, params: nnx.State) -> dict[str, float]:
        return self.values(self.examples(params))


def evaluator(
    tasks: list[Task],
    batch_size: int,
    seq_len: int,
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    t: TrainerConfig,
    mesh: Mesh,
    params_sharding: object,
) -> TaskEvaluator:
    """The tasks' evaluator for parameters laid out as ``params_sharding`` on ``mesh``."""
    batch_sharding = assembly.batch_sharding(mesh, t)
    requests = [r for task in tasks for r in task.requests()]
    per = batch_size // jax.process_count()
    own = slice(jax.process_index() * per, (jax.process_index() + 1) * per)

    def place(rows: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        return assembly.global_batch({k: v[own] for k, v in rows.items()}, batch_sharding)

    return TaskEvaluator(
        tasks,
        eval_tasks.row_batches(requests, seq_len, batch_size),
        assembly.compile_scorer(graphdef, rest, t, mesh, params_sharding, batch_sharding),
        place,
    )


def in_loop(
    t: TrainerConfig, objective: Objective, graphdef: nnx.GraphDef, rest: nnx.State, mesh: Mesh, params: nnx.State
) -> TaskEvaluator | None:
    """The run's task evaluator (None without ``trainer.evals``), for parameters laid out as ``params`` are."""
    if t.evals is None or not t.evals.tasks:
        return None
    _, seq_len = encoding_of(objective)
    shardings = jax.tree.map(lambda x: x.sharding, params)
    return evaluator(load(t.evals, objective), t.evals.batch_size, seq_len, graphdef, rest, t, mesh, shardings)


def due(t: TrainerConfig, eval_every: int | None) -> int | None:
    """Steps between two scorings of the tasks: ``trainer.evals.every``, else the evaluation's."""
    return (
        None if t.evals is None or not t.evals.tasks else (t.evals.every if t.evals.every is not None else eval_every)
    )
