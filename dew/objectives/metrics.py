"""Built-in metrics (the ``Metric`` protocol of ``dew.objectives.base``) and the ones ``dew-train``
hands each objective.

A metric is a small frozen record with a ``name``, a ``best`` flag, a direction and a
``__call__(model, batch, key) -> (sum, count)`` over the batch's real records. Writing one::

    @dataclasses.dataclass(frozen=True)
    class TopFiveAccuracy:
        name: str = "top5"
        best: bool = False
        higher_is_better: bool = True

        def __call__(self, model, batch, key):
            tokens = batch["tokens"].astype(jnp.int32)
            logits = model(tokens[:, :-1])
            top5 = jax.lax.top_k(logits, 5)[1]
            hit = (top5 == tokens[:, 1:, None]).any(-1)
            return masked_sum(hit, batch["mask"])

    recipe.train(objective, dataset, name="lm", metrics=[TopFiveAccuracy(best=True)])

Image objectives get none beyond their loss: flow matching's held-out loss is the metric a user
compares, and a sample-quality metric (FID) is not cheap enough to run at every evaluation.
masked_diffusion's bits per token, and next_token's, are already reported by the objectives
(``eval/bits_per_token``, the loss over ln 2: the best by one is the best by the other).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from dew.contract.objectives import objectives, summary_name
from dew.objectives.base import Batch, Metric, Objective
from dew.objectives.tokens import next_token_inputs


def masked_sum(per_position_BxL: jax.Array, mask_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The sum of a per-position value over the real records of a batch, and their position
    count."""
    per_position = per_position_BxL.astype(jnp.float32).reshape(per_position_BxL.shape[0], -1)
    mask = mask_B.astype(jnp.float32)
    return (per_position.sum(axis=1) * mask).sum(), mask.sum() * per_position.shape[1]


@dataclasses.dataclass(frozen=True)
class NextTokenAccuracy:
    """The fraction of held-out tokens whose most likely next token (argmax of the logits) is the
    true one: ``tokens[:, 1:]`` given ``tokens[:, :-1]``, over the targets next_token trains
    (``next_token_inputs``: packed documents' and a loss mask's weights)."""

    name: str = "accuracy"
    best: bool = False
    higher_is_better: bool = True

    def __call__(self, model: nnx.Module, batch: Batch, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        del key
        inputs_BxL, targets_BxL, weight_BxL, kwargs = next_token_inputs(batch)
        logits_BxLxV = model(inputs_BxL, **kwargs)
        hit_BxL = (jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL).astype(jnp.float32)
        weight_BxL = weight_BxL * batch["mask"].astype(jnp.float32)[:, None]
        return (hit_BxL * weight_BxL).sum(), weight_BxL.sum()


def builtin_metrics(objective: Objective) -> tuple[Metric, ...]:
    """The metrics ``dew-train`` evaluates ``objective`` with: its registered class's ``metrics``."""
    name = summary_name(objective)
    return tuple(objectives[name].metrics()) if name is not None and name in objectives else ()
