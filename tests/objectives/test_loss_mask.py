"""``loss_mask``: next_token's loss is ``sum(mask · nll) / sum(mask)``; a masked target adds exactly
nothing to the loss or the gradient, and the mask travels through gradient accumulation (the
accumulated update is the full batch's, not a mean of micro-batch means)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.models import build
from dew.objectives.autoregressive import NextToken
from dew.objectives.next_token import NextTokenKnobs
from dew.training.state import TrainState
from dew.training.step import make_train_step

V, L = 11, 8


class Logits(nnx.Module):
    """A model whose logits are its parameter, whatever the inputs: the gradient reaches each
    target's logits alone."""

    def __init__(self):
        self.table = nnx.Param(jax.random.normal(jax.random.key(0), (2, L, V)))

    def __call__(self, inputs, **kwargs):
        return self.table[...]


def objective():
    return NextToken(model_config=None, knobs=NextTokenKnobs(), vocab_size=V, seq_len=L)


def test_masked_targets_add_nothing_to_the_loss_or_its_gradient():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, (2, L + 1)).astype(np.int32)
    mask = np.zeros((2, L + 1), np.int32)
    mask[0, 5:], mask[1, 3:7] = 1, 1  # the responses; the rest is prompt
    graphdef, params = nnx.split(Logits())

    def loss(params, tokens):
        out = objective().loss(nnx.merge(graphdef, params), {"tokens": tokens, "loss_mask": mask}, jax.random.key(0))
        return out.total / out.count

    value, grads = jax.value_and_grad(loss)(params, jnp.asarray(tokens))
    nll = -jax.nn.log_softmax(params["table"][...], axis=-1)
    picked = np.take_along_axis(np.asarray(nll), tokens[:, 1:, None], axis=-1)[..., 0]
    want = (picked * mask[:, 1:]).sum() / mask[:, 1:].sum()
    np.testing.assert_allclose(value, want, rtol=1e-6)
    grad = np.asarray(grads["table"][...])
    assert (grad[mask[:, 1:] == 0] == 0).all() and (grad[mask[:, 1:] == 1] != 0).any()
    # another prompt, same response targets: the loss and every gradient are the same, bit for bit
    changed = tokens.copy()
    changed[:, 1:][mask[:, 1:] == 0] = (changed[:, 1:][mask[:, 1:] == 0] + 3) % V
    value2, grads2 = jax.value_and_grad(loss)(params, jnp.asarray(changed))
    assert value2 == value
    np.testing.assert_array_equal(grads2["table"][...], grad)


@pytest.mark.slow
def test_the_mask_travels_through_gradient_accumulation():
    fields = dict(vocab_size=V, seq_len=L, hidden_size=16, depth=1, num_heads=2, matmul_precision="highest")
    graphdef, params, rest = nnx.split(build("transformer", fields, nnx.Rngs(0)), nnx.Param, ...)
    rng = np.random.default_rng(1)
    batch = {"tokens": rng.integers(0, V, (4, L + 1)).astype(np.int32), "loss_mask": np.zeros((4, L + 1), np.int32)}
    batch["loss_mask"][0, 1:] = 1  # the first micro-batch trains 9 targets, the second 1
    batch["loss_mask"][3, -1] = 1
    tx = optax.sgd(0.1)
    after = {}
    for accumulation in (1, 2):
        step = make_train_step(
            objective(), graphdef, rest, tx, lambda s: 0.1, accumulation=accumulation, dynamic_scale=False
        )
        state = dataclasses.replace(
            TrainState.create(params, tx, seed=0, ema=False, dynamic_scale=False), graphdef=graphdef, rest=rest
        )
        state, metrics = jax.jit(step)(state, {k: jnp.asarray(v) for k, v in batch.items()})
        after[accumulation] = (jax.tree.leaves(state.params), float(metrics["train/loss"]))
    for a, b in zip(after[1][0], after[2][0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(after[1][1], after[2][1], rtol=1e-6)
