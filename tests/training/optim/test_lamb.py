"""LAMB on layers stacked in one leaf: one trust ratio per layer (dew.training.optim.lamb), checked
against optax's LAMB run on the layers unstacked into separate leaves."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.config import OptimConfig
from dew.training.optim.build import build_optimizer

DEPTH, STEPS = 2, 12
LR, WD = 0.05, 0.01


def _target(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _train(tx: optax.GradientTransformation, params: dict, targets: dict, weights: dict) -> dict:
    """STEPS updates on the quadratic sum(weights * (params - targets)^2)."""
    state = tx.init(params)
    loss = lambda p: sum(jnp.sum(w * (p[k]["w"] - targets[k]["w"]) ** 2) for k, w in weights.items())  # noqa: E731
    step = jax.jit(lambda p, s: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(jax.grad(loss)(p), s, p)))
    for _ in range(STEPS):
        params, state = step(params, state)
    return params


# Layer 0 of the stack 10x the size of layer 1 and pulled harder: ||x_l|| / ||u_l|| differs from
# layer to layer, so one ratio per stacked leaf and one per layer move them differently.
LAYER_SCALE = np.array([10.0, 1.0], np.float32)
LAYER_WEIGHTS = np.array([100.0, 1.0], np.float32)


@pytest.mark.slow
def test_lamb_takes_one_trust_ratio_per_stacked_layer():
    stacked = {
        "blocks": {"w": _target((DEPTH, 6, 16), 0) * LAYER_SCALE[:, None, None]},
        "head": {"w": _target((16, 4), 1)},
    }
    targets = {"blocks": {"w": _target((DEPTH, 6, 16), 2)}, "head": {"w": _target((16, 4), 3)}}
    config = OptimConfig(optimizer="lamb", learning_rate=LR, weight_decay=WD)
    weights = {"blocks": LAYER_WEIGHTS[:, None, None], "head": 1.0}
    got = _train(build_optimizer(config, stacked, total_steps=STEPS).tx, stacked, targets, weights)

    # The reference: the same model with each layer its own leaf, under optax's LAMB.
    def unstack(tree: dict) -> dict:
        return {**{f"layer{i}": {"w": tree["blocks"]["w"][i]} for i in range(DEPTH)}, "head": tree["head"]}

    lamb = optax.lamb(LR, b1=0.9, b2=0.999, eps=1e-6, weight_decay=WD)
    ref = _train(
        lamb, unstack(stacked), unstack(targets), {**{f"layer{i}": LAYER_WEIGHTS[i] for i in range(DEPTH)}, "head": 1.0}
    )
    for i in range(DEPTH):
        np.testing.assert_allclose(got["blocks"]["w"][i], ref[f"layer{i}"]["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got["head"]["w"], ref["head"]["w"], rtol=2e-5, atol=2e-6)

    # One ratio for the whole stack (optax's LAMB on the stacked leaf) is measurably another update.
    whole = _train(lamb, stacked, targets, weights)
    moved = np.asarray(got["blocks"]["w"]) - stacked["blocks"]["w"]
    apart = np.linalg.norm(np.asarray(whole["blocks"]["w"]) - got["blocks"]["w"]) / np.linalg.norm(moved)
    print("relative difference, one ratio per stack vs per layer:", apart)
    assert apart > 0.05, apart
