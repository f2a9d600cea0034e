"""A causal language model's log-likelihood of continuations: what a downstream task's rows are
scored by (``trainer.evals``, ``dew.data.eval_tasks``), lm-evaluation-harness's ``loglikelihood``
request on dew's devices.

A row is the model's inputs, each input's next token (the targets) and a mask over the targets that
are the continuation's; its score is the sum of ``log softmax(logits)[target]`` over the masked
targets (in float32, as the harness's ``log_softmax`` of a float32 model), and whether each masked
target was the most likely token (the harness's ``is_greedy``: ``argmax == target``, the first of
equal logits winning in both).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

ROLE = "causal_lm"
"""The objective role (``ObjectiveSpec.role``) whose models the tasks score: a model that maps
``[batch, length]`` token ids to ``[batch, length, vocab]`` next-token logits."""


def loglikelihoods(model: nnx.Module, rows: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Per row of ``rows`` (``inputs``, ``targets``, ``mask``, each ``[B, L]``): the continuation's
    summed log-likelihood (nats) ``[B]`` and whether it is the greedy one ``[B]``."""
    logits_BxLxV = model(rows["inputs"]).astype(jnp.float32)
    targets_BxL, mask_BxL = rows["targets"], rows["mask"]
    # -log softmax(logits)[target], one logsumexp over the vocabulary (no second [B, L, V] array).
    nll_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
    ll_B = -jnp.where(mask_BxL, nll_BxL, 0.0).sum(axis=1)
    greedy_B = jnp.all((jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL) | ~mask_BxL, axis=1)
    return ll_B, greedy_B
