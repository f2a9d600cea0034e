"""The objective contract the trainer calls.

An objective builds the module it trains and computes its loss as a *sum and a count* (not a mean),
so that gradient accumulation and evaluation over padded batches normalise by the total count: the
accumulated update equals the full-batch update. The trainer never sees timesteps, noise or masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import jax
from flax import nnx

Batch = Mapping[str, jax.Array]


class Loss(NamedTuple):
    """A loss over a batch: ``total / count`` is the mean; ``sums`` are further metric sums over the
    same count (reported as ``sums[k] / count``)."""

    total: jax.Array
    count: jax.Array  # type: ignore[assignment]  # a field named like tuple.count, which typeshed types as the method
    sums: Mapping[str, jax.Array]
    max_logits: jax.Array | None = None
    """Each attention layer's largest pre-softmax logit per head, ``(depth, heads)``, when the
    loss was asked for them (MuonClip's QK-clip); outside the gradient."""


class Objective(Protocol):
    ema_decay: float
    """Decay of the parameter EMA the trainer keeps for the objective; 0 keeps none."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        """The module this objective trains, initialised from ``rngs``."""
        ...

    def loss(self, model: nnx.Module, batch: Batch, key: jax.Array, *, max_logits: bool = False) -> Loss:
        """The training loss of ``model`` on ``batch``, every random draw from ``key``; with
        ``max_logits`` the model is called with ``return_max_logits=True`` and ``Loss.max_logits``
        carries what it returned."""
        ...

    def evaluate(self, model: nnx.Module, batch: Batch, key: jax.Array) -> Loss:
        """The held-out loss; ``batch["mask"]`` marks real records, ``key`` is fixed per batch so two
        runs' evaluations compare."""
        ...

    # Optional: ``derived_metrics(metrics) -> Mapping[str, float]``, metrics that follow from the
    # reported means (a perplexity is exp of a mean loss, not a mean of sums); the trainer logs them
    # beside the metrics they come from.

    # Optional: ``eval_sums: tuple[str, ...]``, the keys of the ``Loss.sums`` that ``evaluate``
    # returns (reported as ``eval/<key>``), so that a run knows before it trains which values its
    # evaluations report (``dew.training.evaluate.reported``: ``trainer.early_stopping.metric`` is
    # checked against them). Without it the check waits for the first evaluation.

    def summary(self) -> Mapping[str, Any]:
        """The recipe's own view of the run, for the tracker's config."""
        ...


class Metric(Protocol):
    """A metric of the held-out data, computed by the trainer on every evaluation batch beside the
    loss (``RunConfig.train(metrics=...)``) and logged as ``eval/<name>``.

    It returns a *sum and a count* over the batch's real records (``batch["mask"]``: 1 a record, 0
    padding), not a mean: the trainer adds both over the evaluation batches (and, since the batch
    is one global array, over devices and processes) and logs sum / count, so the value is the
    metric of the whole held-out set whatever the batch and the device count
    (``dew.objectives.metrics`` has the built-ins and says how to write one).
    """

    name: str
    """Logged as ``eval/<name>``; unique among the run's metrics and the objective's own."""
    best: bool
    """This metric, not ``eval/loss``, chooses the best checkpoint (at most one metric of a run)."""
    higher_is_better: bool
    """Which way ``best`` reads it (accuracy: higher; a loss: lower)."""

    def __call__(self, model: nnx.Module, batch: Batch, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The metric's sum over the batch's real records and what it counts (records, tokens),
        traced inside the compiled evaluation step; ``key`` is the evaluation's per-batch key."""
        ...
