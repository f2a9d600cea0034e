"""Adam moments in bfloat16 with stochastic rounding (dew.training.optim.bf16)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.config import OptimConfig
from dew.training.optim.bf16 import Bf16AdamState, round_to_bf16_nearest, round_to_bf16_stochastic
from dew.training.optim.build import build_optimizer, state_bytes

N = 200_000


@pytest.mark.parametrize("x", [1.0 + 2.0**-10, -(3.0 + 2.0**-8), 1e-3 * (1 + 2.0**-9)])
def test_stochastic_rounding_is_unbiased_and_nearest_is_not(x):
    values = jnp.full((N,), x, jnp.float32)
    draws = np.asarray(round_to_bf16_stochastic(values, jax.random.key(0)), np.float64)
    lo, hi = np.sort(np.unique(draws))[[0, -1]]
    ulp = hi - lo
    assert set(np.unique(draws)) <= {lo, hi} and lo <= x <= hi  # only the two neighbours
    # the mean is x within 5 standard errors of the mean of a two-point draw
    p = (x - lo) / ulp
    assert abs(draws.mean() - x) < 5 * ulp * np.sqrt(p * (1 - p) / N)
    nearest = float(round_to_bf16_nearest(jnp.float32(x)))
    assert abs(nearest - x) > 10 * ulp * np.sqrt(p * (1 - p) / N)  # biased by far more than that


def test_exact_and_non_finite_values_pass_through():
    x = jnp.asarray([0.0, 1.0, -2.5, 3.0e38, jnp.inf, -jnp.inf], jnp.float32)
    got = round_to_bf16_stochastic(x, jax.random.key(1))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got[:3], np.float32), [0.0, 1.0, -2.5])
    assert np.isinf(np.asarray(got[4:], np.float32)).all()
    assert np.isnan(float(round_to_bf16_stochastic(jnp.float32(jnp.nan), jax.random.key(2))))


PARAMS = {"w": np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), "b": np.zeros((8,), np.float32)}


def _adam_states(state):
    return [
        s
        for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, (Bf16AdamState, optax.ScaleByAdamState)))
        if isinstance(s, (Bf16AdamState, optax.ScaleByAdamState))
    ]


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_moment_dtypes_in_the_state(name):
    for dtype in ["float32", "bfloat16"]:
        opt = build_optimizer(OptimConfig(optimizer=name, state_dtype=dtype), PARAMS, total_steps=4)
        state = opt.tx.init(PARAMS)
        g = jax.tree.map(jnp.ones_like, PARAMS)
        _, state = jax.jit(opt.tx.update)(g, state, PARAMS)
        (adam,) = _adam_states(state)
        for leaf in jax.tree.leaves(adam.mu) + jax.tree.leaves(adam.nu):
            assert leaf.dtype == jnp.dtype(dtype)


@pytest.mark.slow
def test_first_update_equals_float32_adam_and_state_halves():
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), PARAMS)
    got = {}
    for dtype in ["float32", "bfloat16"]:
        opt = build_optimizer(OptimConfig(optimizer="adamw", state_dtype=dtype), PARAMS, total_steps=4)
        state = opt.tx.init(PARAMS)
        got[dtype] = opt.tx.update(grads, state, PARAMS)[0], state_bytes(state)
    for a, b in zip(jax.tree.leaves(got["float32"][0]), jax.tree.leaves(got["bfloat16"][0]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # the update is computed from float32 moments
    moments_f32 = 2 * 4 * sum(p.size for p in PARAMS.values())
    assert got["float32"][1] - got["bfloat16"][1] == moments_f32 // 2


def test_bf16_moments_track_float32_over_many_small_updates():
    # v <- 0.999·v + 0.001·g²: past v ≈ 0.06 each increment is under half a bfloat16 ulp of v, so
    # round-to-nearest walks off the float trajectory while stochastic rounding follows it in the mean.
    params = {"w": np.zeros((4096,), np.float32)}
    opt = build_optimizer(
        OptimConfig(optimizer="adam", state_dtype="bfloat16", learning_rate=0.0), params, total_steps=1
    )
    state = opt.tx.init(params)
    update = jax.jit(opt.tx.update)
    ones = {"w": jnp.ones((4096,), jnp.float32)}
    v_exact, v_nearest = 0.0, 0.0
    for _ in range(200):
        _, state = update(ones, state, params)
        v_exact = 0.999 * v_exact + 0.001
        v_nearest = float(round_to_bf16_nearest(jnp.float32(0.999 * v_nearest + 0.001)))
    (adam,) = _adam_states(state)
    v_stochastic = float(np.asarray(adam.nu["w"], np.float64).mean())
    assert abs(v_stochastic - v_exact) < 0.005 * v_exact, (v_stochastic, v_exact)
    assert abs(v_nearest - v_exact) > 0.05 * v_exact, (v_nearest, v_exact)
