"""flow_matching: the loss at initialisation from the data's variance, and the EMA the trainer keeps
from the objective's ``ema_decay``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.config import ModelConfig
from dew.data.specs import Digits
from dew.objectives.flow_matching import FlowMatchingKnobs
from dew.objectives.rectified_flow import FlowMatching
from dew.training.step import TrainState, make_train_step

FIELDS = {
    "hidden_size": 32,
    "depth": 1,
    "num_heads": 2,
    "patch_size": 2,
    "input_size": 8,
    "in_channels": 1,
    "num_classes": 10,
}


def objective(**knobs) -> FlowMatching:
    return FlowMatching(ModelConfig("simple_dit", FIELDS, dtype="float32"), FlowMatchingKnobs(**knobs), 10, (8, 8, 1))


@pytest.mark.slow
def test_loss_at_init_is_one_plus_the_data_second_moment():
    """The model outputs zero at init, so the loss is E[(ε - x_0)²] = E[ε²] + E[x_0²] = 1 + E[x_0²]."""
    ds = Digits().load(batch_size=1536, seed=0)
    batch = ds.iterator().next()
    o = objective()
    graphdef, state = nnx.split(o.build(nnx.Rngs(params=0)))
    out = jax.jit(lambda s, b, k: o.loss(nnx.merge(graphdef, s), b, k))(
        state, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(0)
    )
    second_moment = float(np.mean(np.square(batch["image"])))
    assert float(out.count) == 1536
    assert float(out.total / out.count) == pytest.approx(1.0 + second_moment, rel=0.01)


@pytest.mark.slow
def test_trainer_step_keeps_the_ema_of_the_parameters():
    """After step k, ema = d_k·ema + (1 - d_k)·params, from the initial parameters, with the decay
    warming up as d_k = min(ema_decay, (1 + k) / (10 + k))."""
    d = 0.9
    o = objective(ema_decay=d, label_dropout=0.0)
    graphdef, params, rest = nnx.split(o.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = optax.sgd(0.1)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        ema=jax.tree.map(jnp.copy, params),
        key=jax.random.PRNGKey(1),
        loss_scale=jnp.ones((), jnp.float32),
        good_steps=jnp.zeros((), jnp.int32),
        nonfinite_step=jnp.full((), -1, jnp.int32),
        graphdef=graphdef,
        rest=rest,
    )
    step = jax.jit(make_train_step(o, graphdef, rest, tx, lambda s: 0.1, accumulation=1, dynamic_scale=False))
    batch = {k: jnp.asarray(v) for k, v in Digits().load(batch_size=16, seed=0).iterator().next().items()}
    p0 = jax.tree.map(np.asarray, params)
    s1, _ = step(state, batch)
    p1, e1 = jax.tree.map(np.asarray, s1.params), jax.tree.map(np.asarray, s1.ema)
    s2, _ = step(s1, batch)
    p2, e2 = jax.tree.map(np.asarray, s2.params), jax.tree.map(np.asarray, s2.ema)
    moved = False
    for a0, a1, ea1, a2, ea2 in zip(*(jax.tree.leaves(t) for t in (p0, p1, e1, p2, e2))):
        d0, d1 = min(d, 1 / 10), min(d, 2 / 11)
        np.testing.assert_allclose(ea1, d0 * a0 + (1 - d0) * a1, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(ea2, d1 * ea1 + (1 - d1) * a2, rtol=1e-5, atol=1e-7)
        moved |= not np.array_equal(a0, a2)
    assert moved
