"""Evaluation: the loss and the metrics over the dataset's evaluation batches, as sums and counts
summed on the devices and divided once at the end, so every batch weighs by its count."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax

from dew.contract.data import SourcedDataset, eval_sources
from dew.training.checkpointing.checkpoints import BEST_METRIC

if TYPE_CHECKING:
    from flax import nnx

    from dew.contract.data import Batch, Dataset
    from dew.contract.evals import Evals
    from dew.objectives.base import Metric, Objective

Sums = tuple[Any, Any, dict[str, Any], dict[str, tuple[Any, Any]]]
"""What one evaluation batch returns, and what the batches add up to: (total loss, count, the
objective's own sums by name, each metric's (sum, count) by name)."""


def derived_metrics(objective: Objective, values: Mapping[str, float]) -> dict[str, float]:
    """Metrics an objective derives from the reported means (next_token's perplexity)."""
    derive = getattr(objective, "derived_metrics", None)
    return dict(derive(values)) if derive is not None else {}


def reported(objective: Objective, metrics: Sequence[Metric], sources: Sequence[str] = ()) -> list[str] | None:
    """The values an evaluation of ``objective`` with ``metrics`` reports, known before anything is
    compiled: ``eval/loss``, the objective's own sums (its declared ``eval_sums``), each metric's and
    what the objective derives from those (``derived_metrics``, asked of placeholder values), and each
    of them again as ``eval/<source>/...`` for every named held-out source of the data (a mixture's
    components: ``dew.contract.data.eval_sources``). None for an objective that does not declare its
    sums: its evaluation says what it reports when it runs. (A dataset without evaluation batches
    reports nothing, which only its evaluation shows.)"""
    sums = getattr(objective, "eval_sums", None)
    if sums is None:
        return None
    values = [BEST_METRIC, *(f"eval/{k}" for k in sums), *(f"eval/{m.name}" for m in metrics)]
    overall = {*values, *derived_metrics(objective, dict.fromkeys(values, 1.0))}
    return sorted(overall | {per_source(source, key) for source in sources for key in overall})


def per_source(source: str, key: str) -> str:
    """``eval/<name>`` of the held-out source ``source``: ``eval/<source>/<name>``."""
    return f"eval/{source}/{key.removeprefix('eval/')}"


def check_sources(sources: Sequence[str], tasks: Sequence[str]) -> None:
    """Refuse a held-out source (a mixture's component) named as a downstream task (``trainer.evals``):
    both would report ``eval/<name>/...``, one over the other."""
    if shared := sorted(set(sources) & set(tasks)):
        raise ValueError(
            f"data.components and trainer.evals.tasks both name {', '.join(shared)}: each reports "
            "eval/<name>/...; rename the component or the task"
        )


def add(a: Sums | None, b: Sums) -> Sums:
    """Two batches' sums added (on the devices: nothing is fetched)."""
    if a is None:
        return b
    sums = {k: a[2].get(k, 0.0) + v for k, v in b[2].items()}
    metrics = {k: (a[3].get(k, (0.0, 0.0))[0] + v, a[3].get(k, (0.0, 0.0))[1] + n) for k, (v, n) in b[3].items()}
    return a[0] + b[0], a[1] + b[1], {**a[2], **sums}, {**a[3], **metrics}


def means(sums: Sums) -> dict[str, float]:
    """``eval/loss`` and ``eval/<name>`` from fetched sums; empty when nothing was counted. A metric
    named like one of the objective's own sums is refused."""
    total, count, own, metrics = sums
    if not count:
        return {}
    values = {BEST_METRIC: float(total / count), **{f"eval/{k}": float(v / count) for k, v in own.items()}}
    for k, (v, n) in metrics.items():
        if f"eval/{k}" in values:
            raise ValueError(f"metric {k!r}: the objective already reports eval/{k}; name the metric otherwise")
        values[f"eval/{k}"] = float(v / n) if n else float("nan")
    return values


class Evaluator:
    """The evaluation of a state's parameters: ``evaluator(params)`` is ``{"eval/loss": ..., ...}``
    (empty when the dataset has no evaluation batches). With ``sources`` (a mixture's held-out data,
    by component), each source's values come too, as ``eval/<source>/loss``, ...: one pass over the
    sources one after the other, the values over all of them the sums of theirs, so ``eval/loss`` is
    the one a pass over ``eval_batches`` gives (dew-eval's)."""

    def __init__(
        self,
        eval_step: Callable[[nnx.State, dict[str, jax.Array], jax.Array], Sums],
        batches: Callable[[], Iterable[Batch]],
        place: Callable[[Batch], dict[str, jax.Array]],
        *,
        seed: int,
        derive: Callable[[Mapping[str, float]], dict[str, float]],
        sources: Callable[[], Mapping[str, Iterable[Batch]]] | None = None,
    ) -> None:
        self.eval_step = eval_step
        """The compiled evaluation of one batch: (params, batch, key) -> its sums."""
        self.batches = batches
        """This process's evaluation batches, from the start, each time it is called."""
        self.place = place
        """A host batch made a global array on the mesh."""
        self.key = jax.random.PRNGKey(seed + 2)
        """Batch i's key is this folded with i: every evaluation draws the same noise."""
        self.derive = derive
        """The objective's derived metrics from the means."""
        self.sources = sources
        """This process's evaluation batches by held-out source, from the start, each time it is
        called (None: ``batches`` alone)."""

    @classmethod
    def over(
        cls,
        dataset: Dataset,
        eval_step: Callable[[nnx.State, dict[str, jax.Array], jax.Array], Sums],
        place: Callable[[Batch], dict[str, jax.Array]],
        *,
        seed: int,
        derive: Callable[[Mapping[str, float]], dict[str, float]],
    ) -> Evaluator:
        """The evaluation of this process's part of ``dataset``'s held-out data (``eval_batches``),
        and of each of its held-out sources on its own where it names them (a mixture's components:
        ``dew.contract.data.SourcedDataset``)."""
        where = (jax.process_index(), jax.process_count())
        sources = None
        if eval_sources(dataset):  # a wrapper of any dataset (debug=overfit's) names none of its own
            assert isinstance(dataset, SourcedDataset)
            sources = functools.partial(dataset.source_eval_batches, *where)
        return cls(eval_step, lambda: dataset.eval_batches(*where), place, seed=seed, derive=derive, sources=sources)

    def __call__(self, params: nnx.State) -> dict[str, float]:
        parts = self.sources() if self.sources is not None else {"": self.batches()}
        total: Sums | None = None
        by_source: dict[str, Sums] = {}
        i = 0  # the batch's number over all the sources: its key is the one a single pass gives it
        for source, batches in parts.items():
            for batch in batches:
                sums = self.eval_step(params, self.place(batch), jax.random.fold_in(self.key, i))
                total, i = add(total, sums), i + 1
                if source:
                    by_source[source] = add(by_source.get(source), sums)
        values = self._values(total)
        for source, sums in by_source.items():
            values.update({per_source(source, k): v for k, v in self._values(sums).items()})
        return values

    def _values(self, sums: Sums | None) -> dict[str, float]:
        if sums is None:
            return {}
        values = means(jax.device_get(sums))
        return {**values, **self.derive(values)} if values else {}


class NotReported(ValueError):
    """A field names an evaluation value the run's evaluations do not report."""


def not_reported(field: str, name: str, values: Iterable[str], error: type[NotReported] = NotReported) -> NotReported:
    """The one error for a ``field`` (``trainer.evals.best``, ``trainer.early_stopping.metric``)
    naming a value ``name`` outside the ``values`` the run's evaluations report."""
    listed = ", ".join(sorted(values)) or "nothing (the dataset has no evaluation batches)"
    return error(f"{field}={name!r} is not among the values this run's evaluations report: {listed}")


def produced(
    objective: Objective, metrics: Sequence[Metric], sources: Sequence[str] = (), evals: Evals | None = None
) -> list[str] | None:
    """Every value the run's evaluations report, known before anything is compiled: the held-out
    ones (``reported``: ``eval/loss``, the objective's and the metrics', and each per held-out source,
    ``eval/<source>/loss``...) and the downstream tasks' (``trainer.evals``, ``eval/<task>/acc``...).
    None for an objective that does not declare its sums."""
    values = reported(objective, metrics, sources)
    return None if values is None else sorted({*values, *(evals.values() if evals is not None else ())})


def check_named(
    field: str, name: str | None, values: Sequence[str] | None, error: type[NotReported] = NotReported
) -> None:
    """Refuse ``field=name`` unless ``name`` is among ``values`` (``produced``); None ``values`` (an
    objective that declares nothing) leaves it to the first evaluation."""
    if name is not None and values is not None and name not in values:
        raise not_reported(field, name, values, error)


def higher_is_better(name: str, metrics: Sequence[Metric], evals: Evals | None = None) -> bool:
    """Whether higher is better for the evaluation value ``name``: a task's value's own direction
    (``trainer.evals``), a metric's (``eval/<metric>``, per source ``eval/<source>/<metric>`` too),
    and lower for the rest (``eval/loss``, ``eval/<source>/loss``, perplexity...)."""
    if evals is not None and name in evals.values():
        return evals.values()[name]
    base = name.removeprefix("eval/")
    return next((m.higher_is_better for m in metrics if base == m.name or base.endswith(f"/{m.name}")), False)


def best_criterion(metrics: Sequence[Metric], evals: Evals | None = None) -> tuple[str, bool]:
    """The key that chooses the best checkpoint and whether higher is better: the metric marked
    ``best``, else the value ``trainer.evals.best`` names (any the run's evaluations report: a task's,
    a held-out source's, ``eval/loss``; ``check_named`` against ``produced`` refuses any other
    before the run), else ``eval/loss``. Names must be unique, and at most one metric is marked (and
    not beside ``trainer.evals.best``)."""
    names = [m.name for m in metrics]
    if evals is not None and evals.best is not None:
        if marked := [m.name for m in metrics if m.best]:
            raise ValueError(
                f"trainer.evals.best={evals.best!r} and metric {marked[0]!r} marked best: one value chooses "
                "the best checkpoint"
            )
        return evals.best, higher_is_better(evals.best, metrics, evals)
    if len(set(names)) != len(names) or "loss" in names:
        raise ValueError(f"metrics: names must be unique and not 'loss' (eval/loss is the objective's); got {names}")
    best = [m for m in metrics if m.best]
    if len(best) > 1:
        raise ValueError(
            f"metrics: {[m.name for m in best]} are all marked best; one metric chooses the best checkpoint"
        )
    return (f"eval/{best[0].name}", best[0].higher_is_better) if best else (BEST_METRIC, False)
